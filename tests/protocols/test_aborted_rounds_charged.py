"""An aborted round is charged when the server saw its updates, and free under a secure layer.

Under DP-SGD with plain aggregation the server receives every client's noisy update in the clear
before the protocol decides whether to release a sum; a round it then aborts still released those
updates to the server. ``build_privacy_layer(secure=False)`` sets ``PrivacyBudget.charge_aborted``
and such rounds are charged. Under masking an aborted round shows the server nothing but masked
words, releases nothing and costs nothing.
"""

import numpy as np
import pytest
from torch import nn

import fedsec
from fedsec import fl_core


class SeenBy(fl_core.PlainAggregation):
    """The project's plain protocol; the server keeps what it is handed (it is in the clear)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = 0

    def aggregate(self, round_index, updates, *, purpose="update"):
        self.seen += len(updates)
        return super().aggregate(round_index, updates, purpose=purpose)


def _clients(k: int):
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(k):
        x = rng.normal(size=(40, 3)).astype(np.float32)
        clients.append((x, (x[:, 0] > 0).astype(np.int64)))
    return clients


def _released_run(protocol, clients):
    return fedsec.Federation(model=nn.Linear(3, 2), clients=clients, test=clients[0],
                             secure=protocol, dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0),
                             rounds=3, batch_size=8).run()


def test_updates_the_server_saw_are_charged_even_when_the_round_aborts():
    clients = _clients(3)
    protocol = SeenBy(min_clients=4)
    fed = fedsec.Federation(model=nn.Linear(3, 2), clients=clients, test=clients[0],
                            secure=protocol, dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0),
                            rounds=3, batch_size=8)
    result = fed.run()
    assert protocol.seen == 9  # every client's noisy update, three rounds, in the clear
    assert result.epsilon > 0, (
        f"the server received {protocol.seen} DP-SGD updates in the clear and the run reports "
        f"epsilon {result.epsilon} (stop: {result.stop_reason})")
    released = _released_run(fl_core.PlainAggregation(), clients)
    assert all(r["status"] == "ok" for r in released.history)
    assert result.epsilon == pytest.approx(released.epsilon)  # charged like released rounds
    assert all(r["status"].startswith("aborted") for r in result.history)


def test_an_aborted_masked_round_releases_nothing_and_costs_nothing():
    """Under masking the round aborts (the clients refuse a threshold outside their bounds) and
    the server holds nothing but masked words: no charge."""
    from fedsec.protocols.masked import MaskedAggregation

    clients = _clients(4)
    protocol = MaskedAggregation(max_weight=40, rng=np.random.default_rng(1), threshold=5,
                                 active=False)
    result = _released_run(protocol, clients)
    assert all(r["status"].startswith("aborted") for r in result.history)
    assert result.epsilon == 0.0
    ok = _released_run(MaskedAggregation(max_weight=40, rng=np.random.default_rng(1),
                                         active=False), clients)
    assert ok.epsilon > 0  # the same layer charges the rounds it releases
