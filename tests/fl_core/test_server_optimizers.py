"""Server optimisers: the update rules of Reddi et al. 2021, checked against the formulas."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.fl_core import FedAvg, SGDTrainer
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.fl_core.server_optimizers import (
    ServerAdam,
    ServerMomentum,
    ServerSGD,
    ServerYogi,
    make_server_optimizer,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

vectors = arrays(np.float32, 7, elements=st.floats(-10, 10, width=32))


@settings(max_examples=25)
@given(vectors, vectors, st.floats(0.01, 3.0))
def test_server_sgd_is_fedavg_with_a_server_learning_rate(w, delta, lr):
    plain = FedAvg(trainer=SGDTrainer(epochs=1, batch_size=0, lr=0.1), server_lr=lr)
    np.testing.assert_allclose(ServerSGD(lr=lr).step(w, delta), plain.apply(w, delta),
                               rtol=1e-6, atol=1e-5)


@settings(max_examples=25)
@given(vectors, st.lists(vectors, min_size=1, max_size=4), st.floats(0.0, 0.95))
def test_momentum_accumulates_the_released_averages(w, deltas, beta):
    optimizer = ServerMomentum(lr=0.5, momentum=beta)
    m = np.zeros(7)
    x = w.astype(np.float64)
    for d in deltas:
        m = beta * m + d
        x = x + 0.5 * m
        w = optimizer.step(w, d)
    np.testing.assert_allclose(w, x, rtol=1e-4, atol=1e-3)


def test_adam_and_yogi_follow_their_formulas_for_two_steps():
    d1, d2 = np.array([0.5, -2.0, 0.0]), np.array([1.0, 1.0, -3.0])
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    for cls in (ServerAdam, ServerYogi):
        optimizer = cls(lr=lr, beta1=b1, beta2=b2, tau=tau)
        w = np.zeros(3, dtype=np.float32)
        m, v = np.zeros(3), np.full(3, tau**2)
        x = np.zeros(3)
        for d in (d1, d2):
            m = b1 * m + (1 - b1) * d
            if cls is ServerAdam:
                v = b2 * v + (1 - b2) * d * d
            else:
                v = v - (1 - b2) * d * d * np.sign(v - d * d)
            x = x + lr * m / (np.sqrt(v) + tau)
            w = optimizer.step(w, d.astype(np.float32))
        np.testing.assert_allclose(w, x, rtol=1e-5)


def test_defaults_and_bad_values_name_the_key():
    assert make_server_optimizer("adam").lr == 0.01 and make_server_optimizer("sgd").lr == 1.0
    assert make_server_optimizer("momentum", lr=0.5, momentum=0.7).momentum == 0.7
    with pytest.raises(InvalidParameterError, match="server_optimizer"):
        make_server_optimizer("adagrad")
    with pytest.raises(InvalidParameterError, match="server_lr"):
        ServerAdam(lr=0.0)
    with pytest.raises(InvalidParameterError, match="server_momentum"):
        ServerMomentum(momentum=1.0)
    with pytest.raises(InvalidParameterError, match="server_lr to the server_optimizer"):
        FedAvg(trainer=SGDTrainer(epochs=1, batch_size=0, lr=0.1), server_lr=0.5,
               server_optimizer=ServerSGD(lr=0.5))
