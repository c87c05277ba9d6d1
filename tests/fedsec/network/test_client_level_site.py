"""A deployed site under client-level DP, in one process: what it checks itself.

Adversary: the coordinator alone. It sends any noise multiplier with the first training job (a
smaller one buys less noise), lies about the number of rounds, and restarts runs; the site is the
project's unmodified :class:`SiteWork`, policy and :class:`EpsilonLedger`.
"""

from __future__ import annotations

import math
import sqlite3

import numpy as np
import pytest
from fedsec.dp import Accountant
from fedsec.dp.ledger import with_steps
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.privacy.client_level import distributed_round_event, sensitivity
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec import fl_core
from fedsec.config import loads_config
from fedsec.network import demo
from fedsec.network.envelope import vector_bytes
from fedsec.network.errors import PolicyRefused
from fedsec.network.ledger import EpsilonLedger
from fedsec.network.policy import SitePolicy, admit_plan
from fedsec.network.site import deployment_problem
from fedsec.network.site_work import SiteWork
from fedsec.privacy import PrivacySettings, build_privacy_layer

ROUNDS = 3
TARGET = 3.0


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = tmp_path_factory.mktemp("cdp-site")
    extra = f'[dp]\nmode = "client"\ntarget_epsilon = {TARGET}\n'
    d = demo.prepare(root / "d", 4, rounds=ROUNDS, extra=extra)
    config = loads_config(d.plan.read_text())
    work = SiteWork.load(config, name=d.sites[0].name, path=d.data[0])
    return d, config, work.length


def _calibrated(config, length: int) -> float:
    """The noise multiplier the coordinator calibrates (the simulation's own code)."""
    s = config.secure
    protocol = MaskedAggregation(max_weight=200, rng=np.random.default_rng(0), clip=s.clip, bits=s.bits)
    data = fl_core.FederatedDataset(name="csv", clients=(fl_core.ArrayDataset(np.zeros((1, 1), np.float32),
                                                                              np.zeros(1, np.int64)),),
                                    test=None, n_classes=2, input_shape=(1,), standardize=False)
    setup = build_privacy_layer(PrivacySettings.from_config(config), data, protocol, length)
    return setup.noise_multiplier


def _site(plan) -> SiteWork:
    d, config, _ = plan
    return SiteWork.load(config, name=d.sites[0].name, path=d.data[0])


def _own_epsilon(config, z: float, length: int) -> float:
    s, p = config.secure, config.dp
    event = distributed_round_event(z, bits=s.bits, length=length, clip_ratio=p.max_grad_norm / s.clip)
    return Accountant(p.accountant).get_epsilon(p.delta, events=[with_steps(event, config.rounds)])


def test_client_level_plans_are_deployable_over_both_layers(plan):
    _, config, _ = plan
    import dataclasses

    assert deployment_problem(config) is None
    paillier = dataclasses.replace(config, secure=dataclasses.replace(config.secure, aggregation="paillier"))
    assert deployment_problem(paillier) is None


@pytest.mark.parametrize("sent", [None, "2.0", True, float("nan"), float("inf"), -1.0, 0.0, 0.3])
def test_a_missing_or_invalid_noise_multiplier_is_refused(plan, sent):
    with pytest.raises(PolicyRefused) as refused:
        _site(plan).start(noise_multiplier=sent)
    assert refused.value.rule == "dp.noise"


def test_the_calibrated_noise_is_accepted_and_less_is_refused(plan):
    _, config, length = plan
    z = _calibrated(config, length)
    work = _site(plan)
    work.start(noise_multiplier=z)
    assert work.privacy.unit == "client"
    _, l2 = sensitivity(config.secure.bits, length, config.dp.max_grad_norm / config.secure.clip)
    assert work.client_noise.total_variance == pytest.approx((z * l2) ** 2, rel=1e-12)
    with pytest.raises(PolicyRefused) as refused:
        _site(plan).start(noise_multiplier=0.97 * z)
    assert refused.value.rule == "dp.noise"


@settings(max_examples=30, deadline=None)
@given(z=st.floats(0.5, 8.0))
def test_any_accepted_noise_multiplier_keeps_the_sites_own_epsilon_within_the_plan(plan, z):
    _, config, length = plan
    work = _site(plan)
    try:
        work.start(noise_multiplier=z)
    except PolicyRefused as refused:
        assert refused.rule == "dp.noise"
        assert _own_epsilon(config, z, length) > TARGET
        return
    assert _own_epsilon(config, z, length) <= TARGET * (1 + 1e-6)
    # the share a site adds grows with the z it accepted: a larger z only adds noise
    assert work.client_noise.noise_multiplier == z


def test_training_clips_to_the_plans_bound_weights_one_and_charges_the_site_per_round(plan):
    _, config, length = plan
    work = _site(plan)
    z = _calibrated(config, length)
    work.start(noise_multiplier=z)
    body = vector_bytes(np.zeros(length, dtype=np.float32))
    for r in range(1, ROUNDS + 1):
        work.train({"round": r, "rng": np.random.default_rng(r).bit_generator.state}, body)
        pending = work.contribution("update", r)
        assert pending[1] == 1
        assert float(np.linalg.norm(pending[0].astype(np.float64))) <= config.dp.max_grad_norm
    assert work.epsilon == pytest.approx(_own_epsilon(config, z, length), rel=1e-9)
    assert work.epsilon <= TARGET * (1 + 1e-6)


def test_the_ledger_counts_client_level_epsilon_and_refuses_past_the_lifetime_cap_across_restarts(plan,
                                                                                                   tmp_path):
    _, config, _ = plan
    policy = SitePolicy(max_epsilon_run=TARGET, max_epsilon_lifetime=2.5 * TARGET,
                        peers=tuple(config.federation.sites))
    state = tmp_path / "state"
    with EpsilonLedger(state, lifetime_cap=policy.max_epsilon_lifetime) as ledger:
        assert admit_plan(policy, config, ledger=ledger, run_id="run-1").unit == "client"
        admit_plan(policy, config, ledger=ledger, run_id="run-1")  # the same plan again: no new charge
        admit_plan(policy, config, ledger=ledger, run_id="run-2")
        with pytest.raises(PolicyRefused) as refused:
            admit_plan(policy, config, ledger=ledger, run_id="run-3")
        assert refused.value.rule == "dp.max_epsilon_lifetime"
    with EpsilonLedger(state, lifetime_cap=policy.max_epsilon_lifetime) as ledger:  # the site restarted
        with pytest.raises(PolicyRefused) as refused:
            admit_plan(policy, config, ledger=ledger, run_id="run-3")
        assert refused.value.rule == "dp.max_epsilon_lifetime"
        assert ledger.spent_by_unit() == {"client": 2 * TARGET}
        with pytest.raises(PolicyRefused) as relabelled:
            ledger.reserve("run-1", TARGET, unit="example")
        assert relabelled.value.rule == "dp.ledger"


def test_a_ledger_from_before_units_reads_its_rows_as_example_level(tmp_path):
    db = sqlite3.connect(tmp_path / "ledger.db")
    db.execute("CREATE TABLE reservations (run_id TEXT PRIMARY KEY, epsilon REAL NOT NULL, "
               "reserved_at TEXT NOT NULL)")
    db.execute("INSERT INTO reservations VALUES ('old', 2.0, '2026-01-01T00:00:00+00:00')")
    db.commit()
    db.close()
    with EpsilonLedger(tmp_path, lifetime_cap=5.0) as ledger:
        ledger.reserve("new", 2.5, unit="client")
        assert ledger.spent_by_unit() == {"client": 2.5, "example": 2.0}
        with pytest.raises(PolicyRefused):
            ledger.reserve("newer", 1.0, unit="client")
        assert math.isclose(ledger.spent(), 4.5)
