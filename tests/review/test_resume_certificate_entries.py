"""Review of 3bdd3b5: checkpoint entries that restore_hub reads back as site certificates.

Adversary: whoever can write the checkpoint between the crash and the resume (or a lying
coordinator). Held: a certificate of another role / another CA / a site's cert under another name is
not put back; the checkpoint holds no private key. Findings (low, fixed after the review; these tests
were strict xfails): a non-string entry killed the resume with a traceback (now skipped: the site is
admitted when it calls), and a 'certificates' value that is not a table did too (now ConfigError on
--resume).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from fedsec.network import demo, pki
from fedsec.network.serve import restore_hub
from fedsec.network.site import load_identity
from tests.fedsec.network.test_resume_certificates import N, _hub, _saved


def test_the_coordinator_certificate_under_a_site_name_is_not_put_back(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    victim = d.sites[0].name
    state["certificates"][victim] = d.coordinator.cert.read_bytes().decode()
    after = _hub(d, tmp_path / "after", pki.Trust.load(d.ca))
    restore_hub(after, state)
    assert victim not in after.peers and victim not in after.certificates
    assert set(after.peers) == {s.name for s in d.sites[1:]}


def test_a_site_certificate_of_another_ca_is_not_put_back(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    other = demo.prepare(tmp_path / "other", N, rounds=2)  # same names, another root
    state = _saved(d, tmp_path)
    victim = d.sites[0]
    foreign = next(s for s in other.sites if s.name == victim.name)
    state["certificates"][victim.name] = foreign.cert.read_bytes().decode()
    after = _hub(d, tmp_path / "after", pki.Trust.load(d.ca))
    restore_hub(after, state)
    assert victim.name not in after.peers


def test_the_checkpoint_entry_holds_no_private_key(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    text = json.dumps(_saved(d, tmp_path))
    assert "PRIVATE KEY" not in text
    for s in d.sites:
        assert s.key.read_bytes().decode().strip().splitlines()[1] not in text


BROKEN_PEM = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize("bad", ["not a certificate", BROKEN_PEM, 42, None, ["x"]])
def test_a_malformed_or_non_string_entry_is_skipped_not_a_traceback(tmp_path, bad):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    state["certificates"][d.sites[0].name] = bad
    after = _hub(d, tmp_path / "after", pki.Trust.load(d.ca))
    restore_hub(after, state)
    assert set(after.peers) == {s.name for s in d.sites[1:]}


def test_a_certificates_list_is_a_clear_error_or_ignored(tmp_path):
    from fedsec.errors import ConfigError  # noqa: F401  (the error restore_hub documents)
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    state["certificates"] = [state["certificates"][d.sites[0].name]]
    after = _hub(d, tmp_path / "after", pki.Trust.load(d.ca))
    try:
        restore_hub(after, state)
    except Exception as exc:  # only the documented clear error is acceptable
        assert type(exc).__name__ == "ConfigError", repr(exc)


def _site_checks(d, trust, certificates):  # type: ignore[no-untyped-def]
    """The honest site's own check of the ring directory the coordinator relays (MaskingSite._directory,
    unmodified), as site 0 with its real identity key."""
    from types import SimpleNamespace

    from fedsec.network.layers.masking import MaskingSite
    me = d.sites[0]
    ctx = SimpleNamespace(names=[s.name for s in d.sites], trust=trust, client_id=0,
                          identity=load_identity(me.identity))
    return MaskingSite._directory(SimpleNamespace(context=ctx), certificates)


def test_a_lying_coordinator_relaying_a_revoked_restored_certificate_is_refused_by_the_site(tmp_path):
    from fedsec.protocols.errors import ClientAbort

    from fedsec.network.layers.masking import BAD_CERTIFICATE
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    revoked = d.sites[1]
    pki.revoke(d.ca.parent, revoked.cert.read_bytes())
    site_trust = pki.Trust.load(d.ca, d.ca.parent / "ca.crl")
    # the lying coordinator ignores its CRL: restores everything (old trust) and relays it
    liar = _hub(d, tmp_path / "after", pki.Trust.load(d.ca))
    restore_hub(liar, state)
    assert revoked.name in liar.certificates
    relayed = {str(k): liar.certificates[s.name].decode() for k, s in enumerate(d.sites)}
    with pytest.raises(ClientAbort, match=BAD_CERTIFICATE):
        _site_checks(d, site_trust, relayed)
    # another site's certificate under a victim's index: refused too (roster name)
    swapped = dict(relayed, **{"2": relayed["1"]})
    with pytest.raises(ClientAbort, match=BAD_CERTIFICATE):
        _site_checks(d, pki.Trust.load(d.ca), swapped)
    # the honest ring passes the unmodified site check
    assert len(_site_checks(d, pki.Trust.load(d.ca), relayed)) == N


def test_a_call_admitted_in_either_order_around_recall_keeps_the_newer_certificate(tmp_path):
    """Race (restore_hub runs twice, calls arrive meanwhile): whichever order admit's writes and
    recall's setdefaults interleave in, the peer and its PEM stay the presented (newer) pair."""
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    site = d.sites[0]
    newer = pki.verify_peer(site.cert.read_bytes(), trust=pki.Trust.load(d.ca), roles=("site",))
    newer = dataclasses.replace(newer)  # a distinct object: recall's verify_peer would return the cached one
    for order in ("admit_then_recall", "cert_then_recall_then_peer", "recall_then_admit"):
        hub = _hub(d, tmp_path / order, pki.Trust.load(d.ca))
        t = hub.transport
        if order == "admit_then_recall":
            t.certificates[site.name] = b"presented"
            t.peers[site.name] = newer
            restore_hub(hub, state)
        elif order == "cert_then_recall_then_peer":
            t.certificates[site.name] = b"presented"
            restore_hub(hub, state)
            t.peers[site.name] = newer
        else:
            restore_hub(hub, state)
            restore_hub(hub, state)  # the second run of restore_hub, deploy_cli then run_coordinator
            t.certificates[site.name] = b"presented"
            t.peers[site.name] = newer
            restore_hub(hub, state)
        assert t.peers[site.name] is newer and t.certificates[site.name] == b"presented", order
