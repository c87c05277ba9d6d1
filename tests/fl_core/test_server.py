import numpy as np
import pytest
import torch
from fedsec.fl_core import AggregationError, RoundObserver, clients_per_round
from fedsec.fl_core.history import HISTORY_COLUMNS

from fedsec import fl_core


def _server(rounds=5, fraction=1.0, protocol=None, lr=0.1, observers=(), seed=0, **kw):
    rng = np.random.default_rng(seed)
    data = fl_core.load_federated("breast_cancer", n_clients=6, rng=rng)
    model = fl_core.build_model("logreg", input_shape=data.input_shape, n_classes=2, seed=1)
    return fl_core.FederatedServer(
        model=model, data=data,
        strategy=fl_core.FedAvg(trainer=fl_core.SGDTrainer(epochs=1, batch_size=16, lr=lr)),
        protocol=protocol or fl_core.PlainAggregation(), rounds=rounds, fraction=fraction, rng=rng,
        observers=observers, **kw)


@pytest.mark.parametrize("fraction,k,m", [(1.0, 10, 10), (0.1, 10, 1), (0.05, 10, 1), (0.3, 10, 3),
                                          (0.5, 7, 3), (0.7, 10, 7)])
def test_clients_per_round(fraction, k, m):
    assert clients_per_round(fraction, k) == m


def test_sampling_takes_m_distinct_clients_each_round():
    seen = []

    class Spy(fl_core.PlainAggregation):
        def aggregate(self, round_index, updates, *, purpose="update"):
            if purpose == "update":
                seen.append([u.client_id for u in updates])
            return super().aggregate(round_index, updates, purpose=purpose)

    _server(rounds=20, fraction=0.5, protocol=Spy()).run()
    assert all(len(s) == 3 and len(set(s)) == 3 for s in seen)
    assert len({tuple(s) for s in seen}) > 3  # different subsets across rounds


def test_same_seed_same_history():
    rows = []
    for _ in range(2):
        history = fl_core.HistoryRecorder()
        _server(rounds=6, fraction=0.5, observers=[history]).run()
        rows.append([{k: v for k, v in r.row().items() if k != "seconds"} for r in history.records])
    assert rows[0] == rows[1]
    history = fl_core.HistoryRecorder()
    _server(rounds=6, fraction=0.5, observers=[history], seed=1).run()
    assert [r.accuracy for r in history.records] != [float(r["accuracy"]) for r in rows[0]]


def test_target_accuracy_stops_and_records_round():
    result = _server(rounds=50, target_accuracy=0.95).run()
    assert result.stop_reason == "target_accuracy"
    assert result.rounds_to_target == result.rounds_run < 50
    assert result.records[-1].accuracy >= 0.95
    assert all(r.accuracy < 0.95 for r in result.records[:-1])


def test_stop_tol_stops_on_small_update():
    result = _server(rounds=200, stop_tol=0.05).run()
    assert result.stop_reason == "stop_tol"
    assert result.records[-1].update_norm < 0.05
    assert all(r.update_norm >= 0.05 for r in result.records[:-1])


def test_observer_veto_keeps_the_last_accepted_model():
    class Budget(RoundObserver):
        def before_round(self, round_index):
            return "budget exhausted" if round_index == 4 else None

    history = fl_core.HistoryRecorder()
    server = _server(rounds=10, observers=[history, Budget()])
    result = server.run()
    assert result.stop_reason == "budget exhausted" and result.rounds_run == 3
    assert np.array_equal(result.vector, fl_core.get_vector(server.model))
    reference = _server(rounds=3).run()
    assert np.array_equal(result.vector, reference.vector)


class Flaky(fl_core.PlainAggregation):
    """Aborts the update rounds listed in ``fail``."""

    def __init__(self, fail):
        super().__init__()
        self.fail = set(fail)

    def aggregate(self, round_index, updates, *, purpose="update"):
        if purpose == "update" and round_index in self.fail:
            raise AggregationError("simulated abort")
        return super().aggregate(round_index, updates, purpose=purpose)


def test_aborted_round_leaves_model_unchanged_and_is_recorded():
    history = fl_core.HistoryRecorder()
    result = _server(rounds=4, protocol=Flaky({2}), observers=[history]).run()
    assert result.rounds_run == 4
    aborted = result.records[1]
    assert aborted.status.startswith("aborted") and aborted.participants == 0 and aborted.dropped == 6
    assert aborted.update_norm == 0.0
    assert aborted.accuracy == result.records[0].accuracy


def test_consecutive_aborts_stop_the_run():
    result = _server(rounds=10, protocol=Flaky({2, 3, 4, 5}), max_consecutive_aborts=3).run()
    assert result.stop_reason == "aborts" and result.rounds_run == 4


class Poisoning(fl_core.SGDTrainer):
    """Trains normally, but every ``every``-th call leaves NaN weights (a diverged client)."""

    def __init__(self, every):
        super().__init__(epochs=1, batch_size=16, lr=0.1)
        self.every, self.calls = every, 0

    def train(self, model, data, *, rng):
        loss = super().train(model, data, rng=rng)
        self.calls += 1
        if self.calls % self.every == 0:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        return loss


def _poisoned_server(every, rounds):
    server = _server(rounds=rounds)
    server.strategy = fl_core.FedAvg(trainer=Poisoning(every))
    return server


def test_diverging_clients_are_counted_not_summed():
    result = _poisoned_server(every=2, rounds=3).run()
    assert result.stop_reason == "rounds"
    assert all(r.metrics["failed_clients"] == 3 and r.participants == 3 and r.dropped == 3
               for r in result.records)
    assert np.isfinite(result.vector).all()


def test_all_clients_diverging_aborts_the_run_with_finite_model():
    server = _poisoned_server(every=1, rounds=10)
    start = fl_core.get_vector(server.model)
    result = server.run()
    assert result.stop_reason == "aborts" and result.rounds_run == 3
    assert all(r.status.startswith("aborted") for r in result.records)
    assert np.array_equal(result.vector, start)


def test_records_fill_the_history_contract():
    history = fl_core.HistoryRecorder()
    _server(rounds=2, observers=[history]).run()
    row = history.records[0].row()
    assert list(row)[: len(HISTORY_COLUMNS)] == list(HISTORY_COLUMNS)
    assert row["participants"] == 6 and row["dropped"] == 0 and row["upload_bytes"] > 0
    assert row["epsilon"] == "" and row["delta"] == ""


@pytest.mark.parametrize("kw", [dict(rounds=0), dict(fraction=0.0), dict(fraction=1.5),
                                dict(target_accuracy=2.0), dict(stop_tol=-1.0),
                                dict(max_consecutive_aborts=0)])
def test_bad_server_arguments(kw):
    with pytest.raises(fl_core.InvalidParameterError):
        _server(**kw)
