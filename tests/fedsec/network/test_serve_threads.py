"""The coordinator runs torch on one intra-op thread, as ``fedsec run`` does (see
:func:`fedsec.network.serve.run_coordinator`): its model copies sit between two stages of every
round, and a second OpenMP thread pre-empted by the site processes made each of them wait."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedsec.config import loads_config
from fedsec.network import demo, pki
from fedsec.network.coordinator import Hub
from fedsec.network.party_audit import PartyAudit
from fedsec.network.serve import run_coordinator
from fedsec.network.site import load_identity


def test_the_coordinator_sets_one_intra_op_thread_before_its_first_round(tmp_path):
    d = demo.prepare(tmp_path / "d", 3, rounds=1)
    plan = d.plan.read_bytes()
    config = loads_config(plan.decode())
    config = dataclasses.replace(config, federation=dataclasses.replace(config.federation, join_timeout=0.05))
    (tmp_path / "c").mkdir()
    audit = PartyAudit(tmp_path / "c", actor="coordinator", key=load_identity(d.coordinator.identity),
                       run_id="t")
    hub = Hub(config=config, plan_bytes=plan, trust=pki.Trust.load(d.ca),
              cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(), audit=audit,
              listen="127.0.0.1:0", poll_wait=0.05)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="0 of 3 sites accepted"):  # no site dialled in
            run_coordinator(config, hub, tmp_path / "out", say=lambda text: None)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
        hub.stop()
        audit.close()
