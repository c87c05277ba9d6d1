"""summary.json's noise warning under ``dp.weights = "equal"`` (sizes covered) uses public constants.

The pre-flight "hopeless noise" warning is written to summary.json with its noise-to-signal ratio.
Under a fixed sample rate it is computed from q, B and round(1 / q) (the run's constants), not
from the mean client size, so one added record does not change a released number.
"""

import dataclasses

import numpy as np

from fedsec import fl_core
from fedsec.config import make_config
from fedsec.experiment import _check_budget, build_experiment

EQUAL = {"dp.mode": "dpsgd", "secure.aggregation": "none", "dp.noise_multiplier": 5000.0,
         "dp.target_epsilon": 0.0, "dp.weights": "equal", "dp.sample_rate": 0.5,
         "train.batch_size": 1000, "data.dataset": "synthetic",
         "data.samples": 120, "data.clients": 4, "rounds": 1, "data.standardize": False}


def test_the_released_warning_does_not_depend_on_the_sizes():
    config = make_config(EQUAL)
    experiment = build_experiment(config)
    n_params = sum(p.numel() for p in experiment.server.model.parameters())
    data = experiment.data
    before = _check_budget(config, data, experiment.privacy, n_params)
    own = data.clients[0]
    grown = list(data.clients)
    grown[0] = fl_core.ArrayDataset(np.concatenate([own.x, own.x[:1]]),
                                    np.concatenate([own.y, own.y[:1]]))
    after = _check_budget(config, dataclasses.replace(data, clients=tuple(grown)),
                          experiment.privacy, n_params)
    assert before, "the warning fires at this noise"
    assert before == after, f"one added record changes summary.json's warning: {before} -> {after}"
