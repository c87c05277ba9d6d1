"""Accountants against reference values, the ledger, and calibration that never overshoots."""

from __future__ import annotations

import json

import pytest
from fedsec.dp import Accountant, InvalidPrivacyParameterError, epsilon, noise_multiplier_for
from fedsec.dp.errors import UnsupportedEventError
from fedsec.dp.ledger import GaussianEvent, PrivacyLedger, SkellamEvent

from fedsec.cli import main


@pytest.mark.parametrize("mechanism,q,sigma,steps,expected,tolerance", [
    ("pld", 0.01, 1.1, 10_000, 5.193, 0.01),     # dp-accounting PLD at discretisation 1e-4
    ("pld", 1.0, 5.0, 50, 6.5729701, 0.01),      # the exact analytic Gaussian value
    ("prv", 0.01, 1.1, 10_000, 5.193, 0.02),
    ("prv", 1.0, 5.0, 50, 6.5729701, 0.02),
    ("rdp", 0.01, 1.1, 10_000, 5.632, 0.005),
])
def test_reference_values(mechanism, q, sigma, steps, expected, tolerance):
    value = epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=1e-5,
                    mechanism=mechanism)
    assert abs(value - expected) <= tolerance
    if mechanism != "rdp":  # tight accountants report upper bounds, never below the truth
        assert value >= expected - 0.001


def test_cli_prints_json(capsys):
    assert main(["privacy", "epsilon", "--q", "0.01", "--sigma", "1.1", "--steps", "10000",
                 "--delta", "1e-5", "--json"]) == 0
    assert abs(json.loads(capsys.readouterr().out)["epsilon"] - 5.193) < 0.01
    assert main(["privacy", "epsilon", "--q", "1.5", "--sigma", "1", "--steps", "1",
                 "--delta", "1e-5"]) == 2


def test_ledger_merges_serialises_and_restores_the_same_epsilon():
    a = Accountant("pld")
    for _ in range(20):
        a.step(noise_multiplier=1.3, sample_rate=0.05, steps=10)
    assert a.ledger.events == [GaussianEvent(1.3, 0.05, 200)]
    b = Accountant("rdp")
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.mechanism == "pld" and b.get_epsilon(1e-5) == a.get_epsilon(1e-5)
    before = a.get_epsilon(1e-5)
    after = a.epsilon_after(1e-5, GaussianEvent(1.3, 0.05, 10))
    assert after > before and a.get_epsilon(1e-5) == before  # a trial leaves the ledger alone
    with pytest.raises(InvalidPrivacyParameterError):
        PrivacyLedger.from_dict({"events": [{"kind": "laplace", "scale": 1}]})
    with pytest.raises(InvalidPrivacyParameterError):
        a.step(noise_multiplier=0, sample_rate=0.1)
    with pytest.raises(InvalidPrivacyParameterError):
        a.get_epsilon(1.5)


def test_skellam_is_accounted_by_rdp_and_approaches_the_gaussian():
    l2 = 1000.0
    skellam = Accountant("pld").get_epsilon(1e-5, events=[SkellamEvent(l2 * 30, l2, (2 * l2) ** 2, 50)])
    gaussian_rdp = epsilon(noise_multiplier=2.0, sample_rate=1.0, steps=50, delta=1e-5, mechanism="rdp")
    assert gaussian_rdp <= skellam <= gaussian_rdp * 1.05  # large variance: almost Gaussian
    with pytest.raises(UnsupportedEventError):
        Accountant("rdp").get_epsilon(1e-5, events=[SkellamEvent(2, 1, 4, 1),
                                                     GaussianEvent(1.0, 1.0, 1)])


@pytest.mark.parametrize("target", [0.5, 3.0])
def test_calibration_never_overshoots(target):
    sigma = noise_multiplier_for(target_epsilon=target, delta=1e-5, sample_rates=[0.1, 0.2],
                                 steps=[300, 150])
    worst = max(epsilon(noise_multiplier=sigma, sample_rate=q, steps=t, delta=1e-5)
                for q, t in ((0.1, 300), (0.2, 150)))
    assert worst <= target
    slightly_less = max(epsilon(noise_multiplier=sigma * 0.99, sample_rate=q, steps=t, delta=1e-5)
                        for q, t in ((0.1, 300), (0.2, 150)))
    assert slightly_less > target * 0.98  # and wastes little
