"""Review r10: ``dp.reproducible = true`` and adversary (B), who holds the run's outputs.

FINDING, low (expected to FAIL today). With reproducible noise the DP noise is keyed from the
seed, and the run directory publishes the seed (config.toml). docs/configuration.md says "not
private against whoever knows the seed", but summary.json still reports a finite epsilon and
``privacy.not_covered`` does not say that the noise is public. The attack below is adversary (B):
from the config alone it rebuilds the initial model and the central client-level noise, and
recovers the exact sum of the clients' clipped updates from the released model.
"""

import numpy as np

import fl_core
from dp import SecureRandom
from fedsec.config import make_config
from fedsec.experiment import build_experiment

SETTINGS = {"dp.mode": "client", "secure.aggregation": "none", "dp.noise_multiplier": 1.0,
            "dp.target_epsilon": 0.0, "dp.reproducible": True, "rounds": 1,
            "data.standardize": False, "seed": 11}


def test_the_released_model_under_reproducible_noise_is_covered_or_said_not_to_be():
    config = make_config(SETTINGS)
    experiment = build_experiment(config)
    privacy = experiment.privacy
    if any("reproducible" in e or "seed" in e for e in privacy.not_covered):
        return  # named: defended
    server = experiment.server
    start = fl_core.get_vector(server.model).copy()  # (B) rebuilds it from config.toml's seed
    wrapped = server.protocol  # ClientLevelDP(PlainAggregation)
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
    assert error > 1e-2, (
        f"the clients' clean sum is recovered to {error:.1e} from the outputs and the seed, while "
        f"summary.json claims epsilon at delta and not_covered is {privacy.not_covered}")
