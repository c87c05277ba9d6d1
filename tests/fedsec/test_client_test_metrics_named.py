"""Evaluation on the clients' own held-out records is a release without noise, named in ``not_covered``.

``Federation(test=None)`` (the default) splits each client's data and ``test=[...]`` takes one test
set per client; the server evaluates every round on those records and releases ``loss``,
``accuracy`` and per-client metrics in the history, without noise: one record of one client (in
its test part) moves the released loss deterministically. ``not_covered`` names it; a single
test set the caller owns (``test=(x, y)``) is not client data and is not named.
"""

import numpy as np
import torch
from torch import nn

import fedsec
from fedsec.privacy import CLIENT_TEST


def _data(canary: float):
    rng = np.random.default_rng(1)
    clients, tests = [], []
    for _ in range(3):
        x = rng.normal(size=(30, 3)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        clients.append((x, y))
        tx = rng.normal(size=(6, 3)).astype(np.float32)
        tests.append((tx, (tx[:, 0] > 0).astype(np.int64)))
    tests[0][0][0, 2] = canary  # one record of client 0
    return clients, tests


def _run(canary: float, test=None):
    torch.manual_seed(0)
    clients, tests = _data(canary)
    fed = fedsec.Federation(model=nn.Linear(3, 2), clients=clients,
                            test=tests if test is None else test, secure=None,
                            dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0, reproducible=True),
                            rounds=1, batch_size=10, seed=3)
    return fed.run()


def test_the_released_test_loss_on_client_records_is_named():
    a, b = _run(0.1), _run(1e3)
    assert CLIENT_TEST in a.not_covered
    # Same seed, same training data: the model is identical, only the client's test record differs
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert abs(a.history[-1]["loss"] - b.history[-1]["loss"]) > 1e-3  # the release it names


def test_the_split_default_is_named_and_a_caller_owned_test_set_is_not():
    clients, tests = _data(0.1)
    split = fedsec.Federation(model=nn.Linear(3, 2), clients=clients, secure=None, rounds=1,
                              dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0)).run()
    assert CLIENT_TEST in split.not_covered
    owned = _run(0.1, test=tests[1])  # one (x, y) test set held by the caller
    assert CLIENT_TEST not in owned.not_covered


def test_the_cli_names_it_for_synthetic_data_only():
    """synthetic pools a share of each client's own draws into the global test split; the other
    data sets hold the test split out before partitioning, so no client holds it."""
    from fedsec.config import make_config
    from fedsec.experiment import build_experiment

    base = {"dp.mode": "dpsgd", "secure.aggregation": "none", "dp.noise_multiplier": 1.0,
            "dp.target_epsilon": 0.0, "rounds": 1, "data.standardize": False}
    synthetic = build_experiment(make_config({**base, "data.dataset": "synthetic",
                                              "data.samples": 120, "data.clients": 4}))
    assert CLIENT_TEST in synthetic.privacy.not_covered
    held_out = build_experiment(make_config({**base, "data.dataset": "breast_cancer"}))
    assert CLIENT_TEST not in held_out.privacy.not_covered
