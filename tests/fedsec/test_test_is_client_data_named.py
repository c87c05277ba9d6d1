"""``Federation(test=...)`` that is, or shares memory with, a client's training records: the
per-round metrics on those records are released without noise, so ``not_covered`` names them.
"""

import numpy as np
from torch import nn

import fedsec
from fedsec.privacy import CLIENT_DATA_TEST


def _clients():
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(3):
        x = rng.normal(size=(40, 3)).astype(np.float32)
        clients.append((x, (x[:, 0] > 0).astype(np.int64)))
    return clients


def _not_covered(clients, test):
    return fedsec.Federation(model=nn.Linear(3, 2), clients=clients, test=test, secure=None,
                             dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0), rounds=1,
                             batch_size=8).run().not_covered


def test_test_set_identical_to_a_clients_records_is_named():
    clients = _clients()
    assert CLIENT_DATA_TEST in _not_covered(clients, clients[0])


def test_test_set_sharing_memory_with_a_client_is_named():
    clients = _clients()
    x, y = clients[1]
    assert CLIENT_DATA_TEST in _not_covered(clients, (x[10:30], y[10:30]))


def test_a_separate_test_set_is_not_named():
    clients = _clients()
    x, y = clients[2]
    assert CLIENT_DATA_TEST not in _not_covered(clients, (x.copy(), y.copy()))
