"""A resumed coordinator puts back the certificate each site was admitted with before the restart,
checked again as a call would be.

Without them, a site the resumed coordinator had not heard from yet had no certificate on record,
and the masking layer refused the whole round ("no verified certificate on record for ...") instead
of counting that site as a dropout (seen in ``test_cut_kill9_real_processes`` when a site redialled
late; ``resume_harness`` now leaves the resumed coordinator only its checkpoint, so the crash search
plays this every time). The adversary here: a checkpoint whose certificates were since revoked, or
filed under another site's name; neither is put back, and a site that called since the restart
keeps the certificate it presented.
"""

from __future__ import annotations

import json

from fedsec.config import loads_config
from fedsec.network import demo, pki
from fedsec.network.coordinator import Hub, SiteInfo
from fedsec.network.party_audit import PartyAudit
from fedsec.network.serve import hub_state, restore_hub
from fedsec.network.site import load_identity

N = 3


def _hub(d, folder, trust):  # type: ignore[no-untyped-def]
    plan = d.plan.read_bytes()
    folder.mkdir()
    audit = PartyAudit(folder, actor="coordinator", key=load_identity(d.coordinator.identity), run_id="t")
    return Hub(config=loads_config(plan.decode()), plan_bytes=plan, trust=trust,
               cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(),
               audit=audit, listen="127.0.0.1:0")


def _saved(d, tmp_path):  # type: ignore[no-untyped-def]
    """The checkpoint entry of a coordinator that admitted every site (JSON, as a checkpoint holds it)."""
    trust = pki.Trust.load(d.ca)
    before = _hub(d, tmp_path / "before", trust)
    for k, s in enumerate(d.sites):
        before.sites[s.name] = SiteInfo(s.name, k, 10, 5, (3,), 2)
        assert before.transport.recall(s.name, s.cert.read_bytes())
    return json.loads(json.dumps(hub_state(before)))


def test_every_site_admitted_before_is_known_after_a_restart(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    after = _hub(d, tmp_path / "after", pki.Trust.load(d.ca))
    assert not after.peers
    restore_hub(after, state)
    assert set(after.peers) == set(after.sites) == {s.name for s in d.sites}
    for s in d.sites:
        expected = pki.verify_peer(s.cert.read_bytes(), trust=pki.Trust.load(d.ca), roles=("site",))
        assert after.peers[s.name].identity_key == expected.identity_key
        assert after.certificates[s.name] == s.cert.read_bytes()


def test_a_certificate_revoked_since_or_filed_under_another_name_is_not_put_back(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    revoked, renamed, honest = d.sites
    pki.revoke(d.ca.parent, revoked.cert.read_bytes())
    state["certificates"][renamed.name] = state["certificates"][honest.name]  # another site's certificate
    after = _hub(d, tmp_path / "after", pki.Trust.load(d.ca, d.ca.parent / "ca.crl"))
    restore_hub(after, state)
    assert set(after.sites) == {s.name for s in d.sites}  # the roster is the checkpoint's
    assert set(after.peers) == {honest.name}
    assert set(after.certificates) == {honest.name}


def test_a_site_that_called_since_the_restart_keeps_what_it_presented(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    after = _hub(d, tmp_path / "after", pki.Trust.load(d.ca))
    first = d.sites[0]
    presented = pki.verify_peer(first.cert.read_bytes(), trust=pki.Trust.load(d.ca), roles=("site",))
    after.transport.peers[first.name] = presented  # as admit() records a call
    after.transport.certificates[first.name] = b"what it presented"
    restore_hub(after, state)
    assert after.peers[first.name] is presented
    assert after.certificates[first.name] == b"what it presented"
    assert set(after.peers) == {s.name for s in d.sites}


def test_an_older_checkpoint_without_certificates_still_resumes(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    state = _saved(d, tmp_path)
    del state["certificates"]
    after = _hub(d, tmp_path / "after", pki.Trust.load(d.ca))
    restore_hub(after, state)
    assert set(after.sites) == {s.name for s in d.sites} and not after.peers
