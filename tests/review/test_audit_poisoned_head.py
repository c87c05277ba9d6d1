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

from fedsec.secagg.keys import SigningKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.audit.log import read_events
from fedsec.network import envelope
from fedsec.network.party_audit import HEAD_HASH, PartyAudit, identity_fingerprint, row_problem
from fedsec.network.pki import Trust, verify_peer
from fedsec.network.site import load_identity
from tests.review.harness import Ring


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
        assert problem == "malformed head"
        try:
            coordinator.event("round", round=1, details={"status": "ok"})
            coordinator.close()
        except Exception:  # noqa: BLE001 - the log stopped
            raise AssertionError(f"the coordinator's log stopped (head check said {problem!r})") from None
        actions = [e.action for e in read_events(tmp_path / "run" / "audit.db")]
        # secure outcome: the honest site's rows and the round are on record
        assert actions[0] == "served" and "round" in actions  # one row for the call
    finally:
        ring.close()


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
        assert problem == "malformed head"
        try:
            audit.event("contribution", round=1, details={"count": 1})  # Site._jobs' next waited event
            audit.close()
        except Exception:  # noqa: BLE001 - the log stopped
            raise AssertionError(f"the site's log stopped (head check said {problem!r})") from None
    finally:
        ring.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(digest=st.text(min_size=60, max_size=68), ref=st.text(max_size=80), stage=st.text(max_size=20),
       round_=st.integers(-2**70, 2**70))
def test_searched_peer_strings_never_stop_a_log(tmp_path_factory, digest, ref, stage, round_):
    """The searching variant: any head hash, and any text or round a peer's value could put into a
    row, is refused before it is queued (head_problem / ValueError), never a failed batch."""
    directory = tmp_path_factory.mktemp("log")
    audit = PartyAudit(directory, actor="coordinator", key=SigningKey.generate(), run_id="r")
    audit.received_then_sent("site-0", "answer", b"a", b"b", round=1)  # an honest row in the batch
    head = {"actor": "site-1", "fingerprint": "f" * 64, "seq": 3, "hash": digest}
    problem = audit.ack_checked(head, actor="site-1", fingerprint="f" * 64, round=1)
    assert (problem is None) == (HEAD_HASH.fullmatch(digest) is not None)
    try:
        audit.event("misbehaved", round=round_, stage=stage, details={"reason": ref}, peer_ref=ref)
    except ValueError:
        assert row_problem(("misbehaved", round_, stage, {"reason": ref}, ref)) is not None
    audit.event("round", round=1, details={"status": "ok"})
    audit.close()
    actions = [e.action for e in read_events(directory / "audit.db")]
    assert actions[0] == "served" and actions[-1] == "round"
