"""``dp.reproducible = true``: the noise is public to whoever holds config.toml, and the run says so.

With reproducible noise the DP noise is keyed from the seed, and the run directory publishes the
seed. Adversary (B), who holds the run's outputs, rebuilds the initial model and the central
client-level noise from the config alone and recovers the exact sum of the clients' clipped
updates from the released model. ``not_covered`` names it (and a warning goes to stderr once);
without ``reproducible`` it is not named.
"""

import numpy as np
from fedsec.dp import SecureRandom

from fedsec import fl_core
from fedsec.config import make_config
from fedsec.experiment import build_experiment
from fedsec.privacy import REPRODUCIBLE

SETTINGS = {"dp.mode": "client", "secure.aggregation": "none", "dp.noise_multiplier": 1.0,
            "dp.target_epsilon": 0.0, "dp.reproducible": True, "rounds": 1,
            "data.standardize": False, "seed": 11}


def test_the_released_model_under_reproducible_noise_is_covered_or_said_not_to_be():
    config = make_config(SETTINGS)
    experiment = build_experiment(config)
    privacy = experiment.privacy
    assert REPRODUCIBLE in privacy.not_covered
    server = experiment.server
    start = fl_core.get_vector(server.model).copy()  # (B) rebuilds it from config.toml's seed
    wrapped = server.protocol.inner  # ChargeOnRelease(ClientLevelDP(PlainAggregation))
    clean = []
    inner_aggregate = wrapped.inner.aggregate

    def spy(round_index, updates, *, purpose="update"):  # what the sum was before the noise
        result = inner_aggregate(round_index, updates, purpose=purpose)
        clean.append(result.weighted_sum.copy())
        return result

    wrapped.inner.aggregate = spy
    result = server.run()
    # Adversary (B): config.toml's seed -> the noise stream; the released model -> the noisy sum
    m = result.records[0].participants
    noisy_sum = (result.vector.astype(np.float64) - start) * m
    noise = SecureRandom.from_seed(config.seed, "client").normal(start.size, 1.0 * config.dp.max_grad_norm)
    recovered = noisy_sum - noise
    error = float(np.abs(recovered - clean[0]).max())
    assert error < 1e-3, f"the attack the not_covered entry names recovers the sum to {error:.1e}"


def test_fresh_noise_is_not_named_and_the_warning_is_given_once(capsys):
    import fedsec.privacy as privacy_module

    privacy_module._warned.clear()
    fresh = build_experiment(make_config({**SETTINGS, "dp.reproducible": False})).privacy
    assert REPRODUCIBLE not in fresh.not_covered
    assert "reproducible" not in capsys.readouterr().err
    build_experiment(make_config(SETTINGS))
    build_experiment(make_config(SETTINGS))
    assert capsys.readouterr().err.count("dp.reproducible = true") == 1
