"""Review r10: ``dp.weights = "equal"`` (sizes covered) with the default ``data.standardize = true``.

FINDING (expected to FAIL today). Equal weights are claimed to make everything a client sends
independent of its size n_k. The canary tests of that claim turn standardisation off and record
only ``purpose="update"``. With the default (standardize on), every client sends its feature
statistics with weight n_k at set-up: in the clear under plain aggregation (and Σ n_k decoded
under masking). One added record changes that weight deterministically, and ``not_covered``
names the statistics (mean and spread) but not the sizes; ``unit_definition`` still says
"sizes covered".
"""

import dataclasses

import numpy as np

import fl_core
from fedsec.config import make_config
from fedsec.experiment import build_experiment
from fedsec.privacy import build_privacy
from fl_core.aggregation import AggregationProtocol

EQUAL = {"dp.mode": "dpsgd", "secure.aggregation": "none", "dp.noise_multiplier": 1.0,
         "dp.target_epsilon": 0.0, "dp.weights": "equal", "dp.sample_rate": 0.05,
         "data.partition": "unbalanced", "dp.reproducible": True, "rounds": 1, "train.lr": 1e-3}


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


def test_equal_weights_hide_sizes_with_standardisation_on_or_say_so():
    before, experiment = _view(False)
    after, _ = _view(True)
    assert experiment.data.standardize  # the default
    privacy = experiment.privacy
    assert "sizes covered" in privacy.unit_definition
    named = any("size" in entry for entry in privacy.not_covered)
    stats = [w for purpose, w in before if purpose == "statistics"]
    stats_after = [w for purpose, w in after if purpose == "statistics"]
    assert named or stats == stats_after, (
        f"under equal weights the server receives the clients' sizes at set-up: {stats[0]} -> "
        f"{stats_after[0]} when client 0 gains a record; not_covered: {privacy.not_covered}")
