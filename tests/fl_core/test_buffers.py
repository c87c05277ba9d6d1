"""Buffers are federated (averaged like weights) or refused, never left at the last client's values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fedsec.fl_core import (
    ArrayDataset,
    ClientUpdate,
    FedAvg,
    PlainAggregation,
    TorchTrainer,
    federate_buffers,
    get_vector,
    restore_buffers,
    set_vector,
)
from fedsec.fl_core.errors import InvalidParameterError
from torch import nn


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 1))


def test_one_round_averages_the_running_statistics_weighted_by_samples():
    """BatchNorm first, one full-batch step: client k's running mean is 0.9 * 0 + 0.1 * mean(x_k),
    so the federated one must be the n_k-weighted average of those (not the last client's)."""
    rng = np.random.default_rng(0)
    clients = [ArrayDataset(rng.normal(loc=k, size=(n, 3)).astype(np.float32),
                            rng.integers(0, 2, n)) for k, n in enumerate((10, 30, 60))]
    model = _bn_model()
    names = federate_buffers(model)
    assert names == ["0.running_mean", "0.running_var"]
    strategy = FedAvg(trainer=TorchTrainer(epochs=1, batch_size=0, lr=0.1))
    w = get_vector(model)
    updates = [ClientUpdate(k, strategy.client_update(model, w, c, rng=rng).vector, float(len(c)))
               for k, c in enumerate(clients)]
    set_vector(model, strategy.apply(w, PlainAggregation().aggregate(1, updates).average()))
    restore_buffers(model)
    expected = sum(len(c) * 0.1 * c.x.mean(0) for c in clients) / 100
    np.testing.assert_allclose(model[0].running_mean.numpy(), expected, rtol=1e-5)
    last_client = 0.1 * clients[-1].x.mean(0)
    assert not np.allclose(model[0].running_mean.numpy(), last_client)
    assert "0.running_mean" in dict(model.named_buffers()) and len(list(model.parameters())) == 4


def test_refuse_names_the_buffers_and_integer_buffers_cannot_be_averaged():
    with pytest.raises(InvalidParameterError, match="running_mean"):
        federate_buffers(_bn_model(), policy="refuse")
    counting = nn.BatchNorm1d(3, momentum=None)  # cumulative average: the counter is read
    with pytest.raises(InvalidParameterError, match="num_batches_tracked"):
        federate_buffers(nn.Sequential(counting))
    plain = nn.Linear(3, 1)
    assert federate_buffers(plain, policy="refuse") == []
