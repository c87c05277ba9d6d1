"""fedsec.Federation: the user's own model and data through the project's loop, protocols and DP."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from fedsec.dp import epsilon
from fedsec.fl_core.server_optimizers import ServerOptimizer
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import roc_auc_score
from torch import nn

import fedsec
from fedsec import fl_core


@pytest.fixture(scope="module")
def hospitals():
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    order = np.random.default_rng(0).permutation(len(y))
    parts = np.array_split(order[:450], 3)
    return [(x[p], y[p]) for p in parts], (x[order[450:]], y[order[450:]])


def _mlp(seed: int = 0, d: int = 30) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, 1))


def _vector(model: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def test_run_returns_history_model_and_epsilon(hospitals):
    clients, test = hospitals
    model = _mlp()
    before = _vector(model)
    result = fedsec.Federation(model=model, clients=clients, test=test, secure=None, rounds=4,
                               batch_size=16, lr=0.1).run()
    assert [r["round"] for r in result.history] == [1, 2, 3, 4]
    assert {"round", "accuracy", "loss", "epsilon", "auroc", "sensitivity",
            "specificity"} <= set(result.history[0])
    assert result.history[-1]["accuracy"] > 0.9 and result.epsilon is None
    assert result.history[-1]["epsilon"] is None and result.stop_reason == "rounds"
    np.testing.assert_array_equal(_vector(model), before)  # the user's model is not trained in place
    logits = result.model(torch.from_numpy(test[0]).float()).detach()
    accuracy = float(((logits[:, 0] > 0).numpy() == test[1]).mean())
    assert accuracy == pytest.approx(result.history[-1]["accuracy"])
    assert result.history[-1]["auroc"] == pytest.approx(
        roc_auc_score(test[1], torch.sigmoid(logits[:, 0].double()).numpy()))


def test_the_same_seed_gives_the_same_run_and_masking_matches_plain_up_to_quantisation(hospitals):
    clients, test = hospitals
    runs = [fedsec.Federation(model=_mlp(), clients=clients, test=test, secure=s, rounds=r,
                              seed=5).run() for s, r in ((None, 3), (None, 3), (None, 1),
                                                         ("masking", 1), ("masking", 1))]
    np.testing.assert_array_equal(_vector(runs[0].model), _vector(runs[1].model))
    np.testing.assert_array_equal(_vector(runs[3].model), _vector(runs[4].model))
    # one round: the same local updates; masking adds only 16-bit quantisation (clip 1)
    np.testing.assert_allclose(_vector(runs[3].model), _vector(runs[2].model), atol=1e-4)


def test_masking_and_dpsgd_spend_at_most_the_target_and_say_so_every_round(hospitals):
    clients, test = hospitals
    dp = fedsec.DP(target_epsilon=2.0, delta=1e-5, max_grad_norm=1.0, reproducible=True)
    result = fedsec.Federation(model=_mlp(), clients=clients, test=test, secure="masking", dp=dp,
                               rounds=3, batch_size=30, lr=0.5).run()
    eps = [r["epsilon"] for r in result.history]
    assert eps == sorted(eps) and 1.9 < eps[-1] <= 2.0 and result.epsilon == eps[-1]
    # the budget is the trainer's: 150 examples, q = 30 / 150, 5 steps a round, the calibrated noise
    assert eps[-1] == pytest.approx(epsilon(noise_multiplier=result.noise_multiplier,
                                            sample_rate=0.2, steps=15, delta=1e-5), rel=1e-6)
    assert result.history[-1]["sample_rate"] == pytest.approx(0.2)
    assert result.delta == 1e-5 and result.history[-1]["accuracy"] > 0.6


@pytest.mark.parametrize("batch_size", [10, 50])
def test_epsilon_follows_the_batch_size_that_trains(hospitals, batch_size):
    clients, test = hospitals
    dp = fedsec.DP(noise_multiplier=1.0, delta=1e-5)
    result = fedsec.Federation(model=_mlp(), clients=clients, test=test, secure=None, dp=dp,
                               rounds=2, batch_size=batch_size).run()
    q = batch_size / 150
    assert result.epsilon == pytest.approx(epsilon(noise_multiplier=1.0, sample_rate=q,
                                                   steps=2 * round(1 / q), delta=1e-5), rel=1e-6)


def test_client_level_dp_with_masking_and_a_server_optimizer(hospitals):
    clients, test = hospitals
    dp = fedsec.DP(mode="client", target_epsilon=10.0, delta=1e-3, max_grad_norm=0.5)
    result = fedsec.Federation(model=_mlp(), clients=clients, test=test, secure="masking", dp=dp,
                               rounds=3, server_optimizer="momentum", server_lr=1.0).run()
    assert result.history[-1]["privacy_unit"] == "client" and 0 < result.epsilon <= 10.0


def test_paillier_with_fedyogi(hospitals):
    clients, test = hospitals
    result = fedsec.Federation(model=_mlp(), clients=clients, test=test, secure="paillier",
                               rounds=1, server_optimizer="yogi", server_lr=0.05).run()
    assert result.history[0]["status"] == "ok" and result.history[0]["participants"] == 3


class Spy(ServerOptimizer):
    """A server optimiser that records every input it is given."""

    def __init__(self, seen: list) -> None:
        self.seen = seen

    def step(self, vector: np.ndarray, delta: np.ndarray) -> np.ndarray:
        self.seen.append(delta.copy())
        return vector + delta


class Recording(fl_core.AggregationProtocol):
    """Wraps a protocol and records what it releases."""

    name = "recording"

    def __init__(self, inner: fl_core.AggregationProtocol, released: list) -> None:
        self.inner, self.released = inner, released

    def aggregate(self, round_index, updates, *, purpose="update"):
        result = self.inner.aggregate(round_index, updates, purpose=purpose)
        self.released.append(result.average())
        return result


def test_server_optimizers_see_the_released_aggregate_and_nothing_else(hospitals, monkeypatch):
    """The server optimiser is post-processing: its only input is what the protocol released."""
    clients, test = hospitals
    seen, released = [], []
    monkeypatch.setattr(fedsec.federation, "make_server_optimizer", lambda *a, **k: Spy(seen))
    from fedsec.protocols.masked import MaskedAggregation

    protocol = Recording(MaskedAggregation(max_weight=150, rng=np.random.default_rng(0)), released)
    fedsec.Federation(model=_mlp(), clients=clients, test=test, secure=protocol, rounds=3).run()
    assert len(seen) == len(released) == 3
    for a, b in zip(seen, released, strict=True):
        np.testing.assert_array_equal(a, b)


def test_optimizer_settings_fedprox_and_uniform_weights_run(hospitals):
    clients, test = hospitals
    for kwargs in ({"optimizer": "adam", "lr": 0.01}, {"momentum": 0.9, "lr": 0.05},
                   {"algorithm": "fedprox", "prox_mu": 0.1}, {"weighting": "uniform"},
                   {"server_optimizer": "adam", "server_lr": 0.05}):
        result = fedsec.Federation(model=_mlp(), clients=clients, test=test, secure="masking",
                                   rounds=3, **kwargs).run()
        assert result.history[-1]["accuracy"] > 0.85, kwargs


def test_uniform_weighting_averages_clients_alike():
    """Three clients of 2, 4 and 30 samples, full-batch SGD: the uniform average is the plain mean
    of the clients' deltas, the default the n_k-weighted one."""
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 3)), rng.integers(0, 2, n)) for n in (2, 4, 30)]
    clients = [(x, np.r_[0, 1, y[2:]]) for x, y in clients]
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    w0 = _vector(model)
    trainer = fl_core.TorchTrainer(epochs=1, batch_size=0, lr=0.5)
    deltas = []
    for x, y in clients:
        local = fl_core.FedAvg(trainer=trainer).client_update(
            copy.deepcopy(model), w0, fl_core.ArrayDataset(x, y), rng=np.random.default_rng(0))
        deltas.append(local.vector)
    for weighting, weights in (("uniform", [1, 1, 1]), ("samples", [2, 4, 30])):
        result = fedsec.Federation(model=model, clients=clients, test=clients[2], secure=None,
                                   rounds=1, batch_size=0, lr=0.5, weighting=weighting).run()
        expected = w0 + np.average(deltas, axis=0, weights=weights)
        np.testing.assert_allclose(_vector(result.model), expected, atol=1e-6)


def test_per_client_test_sets_and_custom_metrics(hospitals):
    clients, _ = hospitals
    seen = []

    def balanced_accuracy(y_true: np.ndarray, y_score: np.ndarray) -> float:
        seen.append(y_score.shape)
        predicted = (y_score > 0.5).astype(int)
        return float(np.mean([(predicted[y_true == c] == c).mean() for c in (0, 1)]))

    result = fedsec.Federation(model=_mlp(), clients=clients, test=None, secure=None, rounds=2,
                               metrics={"balanced_accuracy": balanced_accuracy}).run()
    row = result.history[-1]
    assert {"accuracy_client_0", "accuracy_client_1", "accuracy_client_2"} <= set(row)
    assert 0.5 < row["balanced_accuracy"] <= 1.0 and seen and len(seen[0]) == 1
    sizes = [30, 30, 30]  # stratified 20 % of each client's 150
    pooled = np.average([row[f"accuracy_client_{k}"] for k in range(3)], weights=sizes)
    assert row["accuracy"] == pytest.approx(pooled)


def test_batchnorm_is_federated_or_refused(hospitals):
    clients, test = hospitals
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(30, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    result = fedsec.Federation(model=net, clients=clients, test=test, secure=None,
                               rounds=3).run()
    stats = result.model[1].running_var
    assert "1.running_var" in dict(result.model.named_buffers()) and not torch.all(stats == 1)
    assert result.history[-1]["accuracy"] > 0.85
    with pytest.raises(ValueError, match="running_mean"):
        fedsec.Federation(model=net, clients=clients, test=test, buffers="refuse")
    with pytest.raises(ValueError, match="dp: DP-SGD cannot train this model"):
        fedsec.Federation(model=net, clients=clients, test=test, dp=fedsec.DP(noise_multiplier=1.0))


def test_callbacks_progress_and_standardisation(hospitals, capsys):
    clients, test = hospitals
    raw = load_breast_cancer().data
    rows = []
    result = fedsec.Federation(
        model=_mlp(), clients=[(raw[:150], c[1]) for c in clients], test=(raw[450:], test[1]),
        secure="masking", rounds=5, standardize=True, progress=True,
        dp=fedsec.DP(noise_multiplier=1.0),
        callbacks=[lambda row: rows.append(row) or row["round"] >= 2]).run()
    assert [r["round"] for r in rows] == [1, 2] and result.stop_reason == "callback"
    assert "rounds" in capsys.readouterr().err
    np.testing.assert_allclose(result.feature_mean, raw[:150].mean(0), rtol=1e-3)
    assert any("standardisation" in note for note in result.not_covered)


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"rounds": 0}, "rounds"), ({"lr": -1.0}, "lr"), ({"batch_size": -2}, "batch_size"),
    ({"secure": "tls"}, "secure"), ({"algorithm": "scaffold"}, "algorithm"),
    ({"algorithm": "fedprox"}, "prox_mu"), ({"prox_mu": 0.5}, "prox_mu"),
    ({"optimizer": "lbfgs"}, "optimizer"), ({"server_optimizer": "adagrad"}, "server_optimizer"),
    ({"server_lr": 0.0}, "server_lr"), ({"weighting": "size"}, "weighting"),
    ({"fraction": 0.0}, "fraction"), ({"secure_options": {"clipp": 1}}, "secure_options"),
    ({"dp": fedsec.DP(noise_multiplier=1.0), "optimizer": "adam"}, "dp: DP-SGD runs plain SGD"),
    ({"dp": fedsec.DP(mode="client", noise_multiplier=1.0), "fraction": 0.5}, "fraction"),
    ({"dp": fedsec.DP(mode="client", noise_multiplier=1.0, max_grad_norm=2.0),
      "secure_options": {"clip": 1.0}}, "secure_options: clip must be >= dp.max_grad_norm"),
    ({"loss": lambda out, y: out.mean()}, "loss: must return one loss per example"),
    ({"loss": nn.CrossEntropyLoss()}, "loss: fails"),
    ({"model": "mlp"}, "model"), ({"metrics": {"loss": len}}, "built in"),
])
def test_bad_settings_raise_value_error_naming_the_key(hospitals, kwargs, key):
    clients, test = hospitals
    settings = {"model": _mlp(), "clients": clients, "test": test, **kwargs}
    with pytest.raises(ValueError, match=key):
        fedsec.Federation(**settings)


def test_masking_with_two_clients_is_refused_before_training(hospitals):
    clients, test = hospitals
    with pytest.raises(ValueError, match="secure: masking needs >= 3 clients a round"):
        fedsec.Federation(model=_mlp(), clients=clients[:2], test=test, secure="masking")
    result = fedsec.Federation(model=_mlp(), clients=clients[:2], test=test, secure="paillier",
                               rounds=1).run()
    assert result.history[0]["participants"] == 2


def test_dp_settings_are_validated_by_name():
    for kwargs, key in [({"mode": "local"}, "mode"), ({"target_epsilon": -1.0}, "target_epsilon"),
                        ({"target_epsilon": 1.0, "delta": 1.0}, "delta"), ({}, "target_epsilon"),
                        ({"noise_multiplier": 0.0}, "noise_multiplier"),
                        ({"noise_multiplier": 1.0, "max_grad_norm": 0.0}, "max_grad_norm"),
                        ({"noise_multiplier": 1.0, "accountant": "moments"}, "accountant")]:
        with pytest.raises(ValueError, match=key):
            fedsec.DP(**kwargs)


def test_a_torch_loss_module_is_used_per_example(hospitals):
    clients, test = hospitals
    torch.manual_seed(0)
    two = nn.Sequential(nn.Linear(30, 8), nn.ReLU(), nn.Linear(8, 2))
    result = fedsec.Federation(model=two, clients=clients, test=test, secure=None, rounds=3,
                               loss=nn.CrossEntropyLoss(label_smoothing=0.1)).run()
    assert result.history[-1]["accuracy"] > 0.9 and "auroc" in result.history[-1]


def test_a_server_optimizer_is_post_processing_and_costs_no_epsilon(hospitals):
    clients, test = hospitals
    dp = fedsec.DP(mode="client", noise_multiplier=2.0, delta=1e-3)
    runs = [fedsec.Federation(model=_mlp(), clients=clients, test=test, secure=None, dp=dp,
                              rounds=2, server_optimizer=name).run() for name in ("sgd", "adam")]
    assert runs[0].epsilon == runs[1].epsilon > 0
    assert not np.allclose(_vector(runs[0].model), _vector(runs[1].model))


@pytest.mark.parametrize(("secure", "options", "message"), [
    ("paillier", {"key_bits": 1024}, "key_bits must be 2048 or 3072"),
    ("paillier", {"threshold": 4}, r"threshold must be 0 \(the default rule\) or in \[2, 3\]"),
    ("paillier", {"graph": "harary"}, "apply to secure='masking'"),
    ("paillier", {"custody": "nobody"}, "custody must be one of"),
    ("masking", {"graph": "ring"}, "graph"),
    ("masking", {"bits": 0}, "bits"),
    (None, {"clip": 2.0}, "need secure='masking' or 'paillier'"),
])
def test_secure_options_are_checked_before_training(hospitals, secure, options, message):
    clients, test = hospitals
    with pytest.raises(ValueError, match=message):
        fedsec.Federation(model=_mlp(), clients=clients, test=test, secure=secure,
                          secure_options=options)
