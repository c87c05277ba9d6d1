"""Review r10: evaluation on the clients' own records (library API).

FINDING (expected to FAIL today). ``Federation(test=None)`` (the default) splits each client's data
and ``test=[...]`` takes one test set per client; the server then evaluates every round on those
records and releases ``loss``, ``accuracy`` and per-client metrics in the history, with no noise.
docs/privacy.md calls these "post-processing of released sums", which holds only for a test set
the server owns. One record of one client (in its test part) moves the released loss by an
unbounded amount, deterministically, and ``not_covered`` does not name it.
"""

import numpy as np
import torch
from torch import nn

import fedsec


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


def _run(canary: float):
    torch.manual_seed(0)
    clients, tests = _data(canary)
    fed = fedsec.Federation(model=nn.Linear(3, 2), clients=clients, test=tests, secure=None,
                            dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0, reproducible=True),
                            rounds=1, batch_size=10, seed=3)
    return fed.run()


def test_the_released_test_loss_on_client_records_is_covered_or_named():
    a, b = _run(0.1), _run(1e3)
    if any("test" in e or "evaluat" in e for e in a.not_covered):
        return  # named: defended
    # Same seed, same training data: the model is identical, only the client's test record differs
    same_model = all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert same_model
    la, lb = a.history[-1]["loss"], b.history[-1]["loss"]
    assert abs(la - lb) < 1e-6, (
        f"one test record of client 0 moves the released test loss from {la:.4f} to {lb:.4f} "
        f"(no noise; not in not_covered: {a.not_covered})")
