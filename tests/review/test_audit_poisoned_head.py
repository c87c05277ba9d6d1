"""Adversary: one malicious enrolled site (its own valid certificate and identity key), nothing else.

Claim attacked (docs/audit.md, :mod:`fedsec.network.party_audit`: "a malicious site ... is dropped
and recorded, and the round completes"; the group-commit rule "a crash can lose only message rows
of the calls since the last waited-for event"). The coordinator acknowledges the head each site
hands back in its train answer (``RemoteRound._ack`` -> ``PartyAudit.ack_checked``). The check
wants the site's name, its certificate's fingerprint, an int row and a 64-character ``hash``
string, and then *queues* the ack row. A ``hash`` of 64 lone UTF-16 surrogates (``\\ud800``: valid
JSON escapes, which ``envelope.decode`` turns into a Python str) passes, and its ``peer_ref``
cannot be encoded for SQLite: the whole batch fails, with every other site's queued message
rows in it, and the coordinator's log stops (every later event raises). One site ends the
coordinator's audit, and with it the run.

The coordinator's log here is the project's :class:`PartyAudit`; the head comes off the wire
through ``envelope.decode``.
"""

from __future__ import annotations

import json
import struct

import pytest

from fedsec.audit.log import read_events
from fedsec.network import envelope
from fedsec.network.party_audit import PartyAudit, identity_fingerprint
from fedsec.network.pki import Trust, verify_peer
from fedsec.network.site import load_identity
from tests.review.harness import Ring


@pytest.mark.xfail(strict=True, reason="S4-5: a site head with lone surrogates is acknowledged; its queued "
                                       "ack row fails the batch and stops the coordinator audit log")
def test_a_sites_malformed_head_does_not_stop_the_coordinators_log(tmp_path):
    ring = Ring(tmp_path / "d", 3)
    try:
        d = ring.d
        trust = Trust.load(d.ca)
        (tmp_path / "run").mkdir()
        coordinator = PartyAudit(tmp_path / "run", actor="coordinator",
                                 key=load_identity(d.coordinator.identity), run_id="r")
        victim, attacker = d.sites[1], d.sites[0]
        peer = verify_peer(attacker.cert.read_bytes(), trust=trust, roles=("site",))
        # an honest site's call, queued as the group-commit rule allows
        coordinator.received_then_sent(victim.name, "answer", b"masked input", b"next job", round=1)
        text = ('{"head":{"actor":"%s","fingerprint":"%s","hash":"%s","seq":7},"job":1,"ok":true}'
                % (attacker.name, identity_fingerprint(peer.identity_key), "\\ud800" * 64)).encode()
        header, _ = envelope.decode(envelope.MAGIC + struct.pack(">I", len(text)) + text)
        assert json.loads(text)["head"]["hash"] == "\ud800" * 64 == header["head"]["hash"]
        problem = coordinator.ack_checked(header["head"], actor=attacker.name, round=1,
                                          fingerprint=identity_fingerprint(peer.identity_key))
        try:
            coordinator.event("round", round=1, details={"status": "ok"})
            coordinator.close()
        except Exception:  # noqa: BLE001 - the log stopped
            raise AssertionError(f"the coordinator's log stopped (head check said {problem!r})") from None
        actions = [e.action for e in read_events(tmp_path / "run" / "audit.db")]
        # secure outcome: the honest site's rows and the round are on record
        assert actions[:2] == ["receive", "send"] and "round" in actions
    finally:
        ring.close()


@pytest.mark.xfail(strict=True, reason="S4-5: a coordinator head with lone surrogates, acknowledged by a site"
                                       " (Site._ack), stops the site audit log: its next event raises")
def test_a_coordinators_malformed_head_does_not_stop_a_sites_log(tmp_path):
    ring = Ring(tmp_path / "d", 3)
    try:
        d = ring.d
        site = d.sites[0]
        (tmp_path / "site").mkdir()
        audit = PartyAudit(tmp_path / "site", actor=site.name, key=load_identity(site.identity), run_id="r")
        server = verify_peer(d.coordinator.cert.read_bytes(), trust=Trust.load(d.ca), roles=("server",))
        head = {"actor": "coordinator", "fingerprint": identity_fingerprint(server.identity_key),
                "seq": 3, "hash": "\ud800" * 64}
        problem = audit.ack_checked(head, actor="coordinator", round=1,
                                    fingerprint=identity_fingerprint(server.identity_key))
        try:
            audit.event("contribution", round=1, details={"count": 1})  # Site._jobs' next waited event
            audit.close()
        except Exception:  # noqa: BLE001 - the log stopped
            raise AssertionError(f"the site's log stopped (head check said {problem!r})") from None
    finally:
        ring.close()
