"""One privacy budget per ``fedsec.Federation``: a second ``run()`` under DP is refused.

Each ``run()`` would start a fresh ledger and release another model of the same records at a full
budget (two calls spend about twice the target). The second call raises BudgetExhaustedError
naming ``run``; a Federation without DP may run again.
"""

import numpy as np
import pytest
from fedsec.dp.errors import BudgetExhaustedError
from torch import nn

import fedsec


def _clients():
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(3):
        x = rng.normal(size=(40, 3)).astype(np.float32)
        clients.append((x, (x[:, 0] > 0).astype(np.int64)))
    return clients


def test_a_second_run_under_dp_is_refused():
    target = 1.0
    fed = fedsec.Federation(model=nn.Linear(3, 2), clients=_clients(), test=_clients()[0],
                            secure=None, dp=fedsec.DP(mode="dpsgd", target_epsilon=target),
                            rounds=2, batch_size=10)
    first = fed.run()
    assert 0 < first.epsilon <= target
    with pytest.raises(BudgetExhaustedError, match="^run: .*one budget per Federation"):
        fed.run()
    fresh = fedsec.Federation(model=nn.Linear(3, 2), clients=_clients(), test=_clients()[0],
                              secure=None, dp=fedsec.DP(mode="dpsgd", target_epsilon=target),
                              rounds=2, batch_size=10)
    assert 0 < fresh.run().epsilon <= target  # a new Federation: the caller composes the two


def test_without_dp_a_federation_runs_again():
    fed = fedsec.Federation(model=nn.Linear(3, 2), clients=_clients(), test=_clients()[0],
                            secure=None, rounds=1, batch_size=10)
    assert fed.run().epsilon is None and fed.run().epsilon is None
