"""Adversary: one malicious enrolled site, first to accept the plan.

``Hub._accept`` (what ``fedsec serve`` runs) checks a site's reported record shape and number of
classes against the first site that accepted, not against the plan (whose ``data.columns`` and
``data.classes`` fix both). A malicious site that accepts first with a bogus shape makes every
honest site's ``accept`` fail (``INVALID_ARGUMENT``), so the run never reaches ``min_sites``.
"""

from __future__ import annotations

import hashlib

import pytest

from fedsec.config import loads_config
from fedsec.network import demo, envelope, pki
from fedsec.network.coordinator import Hub
from fedsec.network.party_audit import PartyAudit
from fedsec.network.site import load_identity

N = 4


@pytest.mark.xfail(strict=True, reason="FINDING R11: the first site to accept fixes the federation's record "
                                        "shape; a malicious site accepting first with a bogus shape locks "
                                        "out every honest site")
def test_a_site_accepting_first_with_a_bogus_shape_does_not_lock_out_the_others(tmp_path):
    d = demo.prepare(tmp_path / "d", N, rounds=2)
    plan = d.plan.read_bytes()
    config = loads_config(plan.decode())
    trust = pki.Trust.load(d.ca)
    (tmp_path / "coordinator").mkdir()
    audit = PartyAudit(tmp_path / "coordinator", actor="coordinator",
                       key=load_identity(d.coordinator.identity), run_id="review")
    hub = Hub(config=config, plan_bytes=plan, trust=trust, cert_pem=d.coordinator.cert.read_bytes(),
              key_pem=d.coordinator.key.read_bytes(), audit=audit, listen="127.0.0.1:0")
    peers = [pki.verify_peer(s.cert.read_bytes(), trust=trust, roles=("site",)) for s in d.sites]
    sha = hashlib.sha256(plan).hexdigest()
    features = len(config.data.columns)
    try:
        hub.handle(peers[N - 1], "accept", envelope.encode({"sha256": sha, "n_train": 100, "n_test": 20,
                                                            "input_shape": [features + 1], "n_classes": 2}))
        refused = []
        for k in range(N - 1):
            try:
                hub.handle(peers[k], "accept", envelope.encode({"sha256": sha, "n_train": 100, "n_test": 20,
                                                                "input_shape": [features], "n_classes": 2}))
            except ValueError:
                refused.append(d.sites[k].name)
        assert not refused, f"honest sites locked out by {d.sites[N - 1].name}: {refused}"
    finally:
        audit.close()
