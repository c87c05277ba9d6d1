"""The strategy keys of the TOML configuration: train.algorithm = fedprox, train.prox_mu,
train.server_optimizer and train.server_lr."""

from __future__ import annotations

import pytest

from fedsec import fl_core
from fedsec.config import make_config
from fedsec.errors import ConfigError
from fedsec.experiment import build_experiment, run_experiment


def test_fedprox_and_server_optimizers_are_built_from_the_keys():
    experiment = build_experiment(make_config({
        "rounds": 2, "dp.mode": "none", "train.algorithm": "fedprox", "train.prox_mu": 0.01,
        "train.server_optimizer": "adam", "train.server_lr": 0.05}))
    strategy = experiment.server.strategy
    assert isinstance(strategy, fl_core.FedProx) and strategy.mu == 0.01
    assert isinstance(strategy.trainer, fl_core.TorchTrainer) and strategy.trainer.prox_mu == 0.01
    assert isinstance(strategy.server_optimizer, fl_core.ServerAdam)
    assert strategy.server_optimizer.lr == 0.05
    default = build_experiment(make_config({"rounds": 2, "train.server_optimizer": "yogi"}))
    assert default.server.strategy.server_optimizer.lr == 0.01  # the optimizer's default
    plain = build_experiment(make_config({"rounds": 2}))
    assert plain.server.strategy.server_optimizer is None  # unchanged default: FedAvg, lr 1


@pytest.mark.parametrize(("values", "key", "message"), [
    ({"train.algorithm": "fedprox", "dp.mode": "none"}, "train.prox_mu", "must be > 0"),
    ({"train.prox_mu": 0.1}, "train.prox_mu", "needs train.algorithm = 'fedprox'"),
    ({"train.algorithm": "fedsgd", "dp.mode": "none", "train.server_optimizer": "adam"},
     "train.server_optimizer", "needs train.algorithm"),
    ({"train.algorithm": "fedprox", "train.prox_mu": 0.1}, "train.algorithm", "proximal"),
    ({"train.server_optimizer": "adagrad"}, "train.server_optimizer", "must be one of"),
    ({"train.server_lr": -1.0}, "train.server_lr", "must be"),
])
def test_bad_strategy_keys_name_the_key(values, key, message):
    with pytest.raises(ConfigError, match=message) as info:
        make_config(values)
    assert info.value.key == key


@pytest.mark.parametrize("values", [
    {"train.algorithm": "fedprox", "train.prox_mu": 0.05, "dp.mode": "client",
     "dp.target_epsilon": 8.0},
    {"train.server_optimizer": "momentum", "train.server_lr": 0.5},
])
def test_strategies_compose_with_masking_and_dp(values):
    summary = run_experiment(make_config({"rounds": 3, "dp.reproducible": True, **values}))
    assert summary["rounds_run"] == 3 and summary["final_accuracy"] > 0.8
    assert summary["privacy"]["epsilon"] <= summary["privacy"]["target_epsilon"]
