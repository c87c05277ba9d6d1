"""Review r10: an aborted round "released nothing and costs nothing" (protocols/privacy/budget.py).

FINDING (expected to FAIL today). That holds when the protocol hides the inputs of a round it
aborts. Under DP-SGD with plain aggregation the server receives every client's noisy update in the
clear *before* the protocol decides whether to release a sum (docs/privacy.md §4: "its DP-SGD
output, in the clear"). Through the library API (``secure=`` a protocol instance) a plain
protocol with ``min_clients`` above the round's clients aborts every round: the server sees three
fresh DP-SGD outputs per client from the same global model, and the run reports epsilon 0.
"""

import numpy as np
from torch import nn

import fedsec
import fl_core


class SeenBy(fl_core.PlainAggregation):
    """The project's plain protocol; the server keeps what it is handed (it is in the clear)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = 0

    def aggregate(self, round_index, updates, *, purpose="update"):
        self.seen += len(updates)
        return super().aggregate(round_index, updates, purpose=purpose)


def test_updates_the_server_saw_are_charged_even_when_the_round_aborts():
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(3):
        x = rng.normal(size=(40, 3)).astype(np.float32)
        clients.append((x, (x[:, 0] > 0).astype(np.int64)))
    protocol = SeenBy(min_clients=4)
    fed = fedsec.Federation(model=nn.Linear(3, 2), clients=clients, test=clients[0],
                            secure=protocol, dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0),
                            rounds=3, batch_size=8)
    result = fed.run()
    assert protocol.seen == 9  # every client's noisy update, three rounds, in the clear
    assert result.epsilon > 0, (
        f"the server received {protocol.seen} DP-SGD updates in the clear and the run reports "
        f"epsilon {result.epsilon} (stop: {result.stop_reason})")
