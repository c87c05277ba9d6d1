"""Adversary: one malicious enrolled site, first to accept the plan.

``Hub._accept`` (what ``fedsec serve`` runs) checked a site's reported record shape and number of
classes against the first site that accepted. Fixed (R11): it checks them against the plan (whose
``data.columns`` and ``data.classes`` fix both), so a malicious site that accepts first with a
bogus shape is refused itself and locks nobody out.
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
        with pytest.raises(ValueError):  # the bogus shape is refused (a typed error): the secure outcome
            hub.handle(peers[N - 1], "accept", envelope.encode({"sha256": sha, "n_train": 100, "n_test": 20,
                                                                "input_shape": [features + 1],
                                                                "n_classes": 2}))
        refused = []
        for k in range(N - 1):
            try:
                hub.handle(peers[k], "accept", envelope.encode({"sha256": sha, "n_train": 100, "n_test": 20,
                                                                "input_shape": [features], "n_classes": 2}))
            except ValueError:
                refused.append(d.sites[k].name)
        assert not refused, f"honest sites locked out by {d.sites[N - 1].name}: {refused}"
        assert d.sites[N - 1].name not in hub.sites
    finally:
        audit.close()


@pytest.mark.parametrize("shape, classes", [([1], 2), ([2, 3], 2), ([0], 2), ("x", 2), (None, 3)])
def test_search_every_bogus_first_shape_is_refused_and_honest_sites_join(tmp_path, shape, classes):
    """The malicious first site's shape/classes vary; the plan's shape is the only one accepted."""
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
    honest = {"sha256": sha, "n_train": 100, "n_test": 20, "input_shape": [len(config.data.columns)],
              "n_classes": len(config.data.classes)}
    try:
        with pytest.raises(ValueError):
            hub.handle(peers[0], "accept", envelope.encode({**honest, "input_shape": shape,
                                                            "n_classes": classes}))
        for k in range(1, N):
            hub.handle(peers[k], "accept", envelope.encode(honest))
        assert set(hub.sites) == {s.name for s in d.sites[1:]}
    finally:
        audit.close()
