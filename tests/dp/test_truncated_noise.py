"""The Gaussian sampler is truncated (Box-Muller from 53-bit uniforms): small noise is refused.

``SecureRandom.normal`` draws the radius as sqrt(-2 ln u) with u >= 2^-53, so no sample exceeds
R = sqrt(106 ln 2) = 8.5717 standard deviations. With sensitivity Delta and noise sigma Delta,
an output beyond R sigma Delta from the neighbour's mean is impossible without the record and
has probability Phi(-(R - 1 / sigma)) with it: delta >= that at every epsilon. At sigma = 0.1 it
is about 0.92 per round, so noise multipliers below 0.5 are refused (DPSGD, ClientLevelDP,
fedsec.DP, the configuration; calibration never returns less), and the budget reports the extra
delta ``delta_truncation`` = steps * 2 Phi(-(R - 1 / sigma)), which bounds the tail event.
"""

import math

import numpy as np
import pytest
from fedsec.dp import DPSGD, SecureRandom, noise_multiplier_for
from fedsec.dp.errors import InvalidPrivacyParameterError
from fedsec.dp.noise import MIN_NOISE_MULTIPLIER, TRUNCATION_RADIUS, truncation_delta
from fedsec.fl_core.aggregation import PlainAggregation
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.fl_core.history import RoundRecord
from fedsec.protocols.privacy import ClientLevelDP, PrivacyBudget

import fedsec
from fedsec.config import make_config
from fedsec.errors import ConfigError

R = math.sqrt(-2 * math.log(2.0 ** -53))
assert R == TRUNCATION_RADIUS
Z, S, DELTA = 0.1, 1.0, 1e-5


def test_the_noise_support_is_bounded():
    draws = SecureRandom(b"\x01" * 32).normal(400_000)
    assert np.abs(draws).max() <= R


@pytest.mark.parametrize("z", [0.1, 0.3, 0.49])
def test_noise_below_the_floor_is_refused_everywhere(z):
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        ClientLevelDP(PlainAggregation(), clip_norm=S, noise_multiplier=z,
                      random=SecureRandom(b"\x02" * 32))
    with pytest.raises(InvalidPrivacyParameterError, match="noise_multiplier"):
        DPSGD(noise_multiplier=z, max_grad_norm=1.0, batch_size=4)
    with pytest.raises(ValueError, match="noise_multiplier"):
        fedsec.DP(mode="client", noise_multiplier=z)
    with pytest.raises(ConfigError, match="^dp.noise_multiplier"):
        make_config({"dp.mode": "dpsgd", "dp.noise_multiplier": z, "dp.target_epsilon": 0.0})


def test_calibration_never_returns_less_than_the_floor():
    sigma = noise_multiplier_for(target_epsilon=1e6, delta=DELTA, sample_rates=[1.0], steps=[1])
    assert sigma == MIN_NOISE_MULTIPLIER


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0])
def test_the_truncation_delta_bounds_the_tail_event(z):
    """With the record (clipped update S e_0) the released coordinate exceeds R z S with
    probability Phi(-(R - 1 / z)); without it never. ``truncation_delta`` charges at least that
    per step, and the budget reports it for the run's steps."""
    tail = 0.5 * math.erfc((R - 1 / z) / math.sqrt(2))
    assert truncation_delta(z, 1) >= tail
    assert truncation_delta(z, 1000) == pytest.approx(1000 * truncation_delta(z, 1))
    assert truncation_delta(0.5, 1) < 1e-10  # the floor keeps it negligible per step
    layer = ClientLevelDP(PlainAggregation(), clip_norm=S, noise_multiplier=z,
                          random=SecureRandom(b"\x02" * 32))
    budget = PrivacyBudget(profiles=[layer.round_events(4)], delta=DELTA, target_epsilon=0.0,
                           accountant="rdp", unit="client", noise_multiplier=z)
    record = RoundRecord(round=1, accuracy=0.0, loss=0.0, train_loss=0.0, participants=1, dropped=0,
                         upload_bytes=0, seconds=0.0, update_norm=0.0)
    budget.after_round(record)
    assert record.metrics["delta_truncation"] == truncation_delta(z, 1)


def test_draws_at_the_floor_stay_inside_the_radius():
    draws = SecureRandom(b"\x03" * 32).normal(100_000, 0.5)
    assert np.abs(draws).max() <= R * 0.5
