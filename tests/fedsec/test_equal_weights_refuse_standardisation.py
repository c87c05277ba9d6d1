"""``dp.weights = "equal"`` (sizes covered) refuses ``data.standardize = true``.

Standardisation sends every client's feature statistics with weight n_k at set-up (in the clear
under plain aggregation, summed under masking), so one added record changes a released weight
deterministically, which "sizes covered" promises it does not. The configuration refuses the
combination (ConfigError on data.standardize); with standardisation off, nothing the server
receives depends on the sizes outside the mechanism.
"""

import dataclasses

import numpy as np
import pytest
import torch
from fedsec.fl_core.aggregation import AggregationProtocol

from fedsec import fl_core
from fedsec.config import make_config
from fedsec.errors import ConfigError
from fedsec.experiment import build_experiment

EQUAL = {"dp.mode": "dpsgd", "secure.aggregation": "none", "dp.noise_multiplier": 1.0,
         "dp.target_epsilon": 0.0, "dp.weights": "equal", "dp.sample_rate": 0.05,
         "data.partition": "unbalanced", "dp.reproducible": True, "rounds": 1, "train.lr": 1e-3,
         "data.standardize": False}


class AllRecorder(AggregationProtocol):
    def __init__(self, inner):
        self.inner, self.name, self.client_metrics = inner, inner.name, inner.client_metrics
        self.seen = []

    def aggregate(self, round_index, updates, *, purpose="update"):
        self.seen.append((purpose, [(u.client_id, u.weight) for u in updates]))
        return self.inner.aggregate(round_index, updates, purpose=purpose)


def _view(add: bool):
    config = make_config(EQUAL)
    experiment = build_experiment(config)
    server = experiment.server
    if add:
        own = server.data.clients[0]
        clients = list(server.data.clients)
        clients[0] = fl_core.ArrayDataset(np.concatenate([own.x, own.x[:1]]),
                                          np.concatenate([own.y, own.y[:1]]))
        server.data = dataclasses.replace(server.data, clients=tuple(clients))
    recorder = AllRecorder(server.protocol)
    server.protocol = recorder
    server.run()
    return recorder.seen, experiment


def test_equal_weights_refuse_standardisation():
    with pytest.raises(ConfigError, match="^data.standardize: dp.weights = 'equal'") as error:
        make_config({**EQUAL, "data.standardize": True})
    assert error.value.key == "data.standardize"
    make_config({**EQUAL, "dp.weights": "samples", "data.standardize": True})  # sizes public: fine


def test_with_standardisation_off_the_server_receives_no_size():
    before, experiment = _view(False)
    after, _ = _view(True)
    privacy = experiment.privacy
    assert "sizes covered" in privacy.unit_definition
    assert not any(purpose == "statistics" for purpose, _ in before + after)
    weights = [w for _, seen in before + after for _, w in seen]
    assert weights and set(weights) == {1.0}  # every update carries weight 1, with or without
    assert not any("size" in entry for entry in privacy.not_covered)


def test_the_library_refuses_standardisation_with_equal_weighting_under_dp():
    import fedsec

    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(20, 3)).astype(np.float32), rng.integers(0, 2, 20))
               for _ in range(3)]
    dp = fedsec.DP(mode="dpsgd", noise_multiplier=1.0)
    with pytest.raises(ValueError, match="^standardize: "):
        fedsec.Federation(model=torch.nn.Linear(3, 2), clients=clients, secure=None, dp=dp,
                          standardize=True, weighting="uniform")
    fedsec.Federation(model=torch.nn.Linear(3, 2), clients=clients, secure=None, dp=dp,
                      standardize=False, weighting="uniform")
