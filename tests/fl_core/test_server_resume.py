"""The server loop's resume point and Ctrl-C, in process (plain aggregation, tiny data)."""

from __future__ import annotations

import numpy as np
from fedsec.fl_core.history import HistoryRecorder, ResumePoint, RoundObserver, RoundRecord

from fedsec import fl_core


def _server(rounds: int, observers: list[RoundObserver]) -> fl_core.FederatedServer:
    rng = np.random.default_rng(3)
    data = fl_core.load_federated("breast_cancer", n_clients=4, partition="iid", test_fraction=0.2, rng=rng)
    model = fl_core.build_model("logreg", input_shape=data.input_shape, n_classes=data.n_classes, seed=1)
    return fl_core.FederatedServer(model=model, data=data, strategy=fl_core.FedAvg(
        trainer=fl_core.SGDTrainer(epochs=1, batch_size=16, lr=0.1)), protocol=fl_core.PlainAggregation(),
        rounds=rounds, fraction=0.5, rng=rng, observers=observers)


class _Snapshot(RoundObserver):
    def __init__(self, server_ref: list) -> None:
        self.server_ref, self.states = server_ref, {}

    def after_round(self, record: RoundRecord) -> None:
        server = self.server_ref[0]
        self.states[record.round] = (fl_core.get_vector(server.model),
                                     server.rng.bit_generator.state)


def test_resuming_from_a_round_gives_the_uninterrupted_run() -> None:
    ref: list = []
    snap = _Snapshot(ref)
    history = HistoryRecorder()
    whole = _server(5, [history, snap])
    ref.append(whole)
    full = whole.run()
    again = _server(5, [HistoryRecorder()])
    again.prepare_data()
    vector, state = snap.states[2]
    again.rng.bit_generator.state = state
    resumed = again.run(resume=ResumePoint(2, vector, full.records[:2]))
    assert np.array_equal(resumed.vector, full.vector)
    assert [r.accuracy for r in resumed.records] == [r.accuracy for r in full.records]
    assert again.observers[0].records[:2] == full.records[:2] and len(again.observers[0].records) == 5
    unrestored = _server(5, [])  # the generator is what the checkpoint must carry
    assert not np.array_equal(unrestored.run(resume=ResumePoint(2, vector, full.records[:2])).vector,
                              full.vector)


class _CtrlC(RoundObserver):
    def before_round(self, round_index: int) -> str | None:
        if round_index == 3:
            raise KeyboardInterrupt
        return None


def test_ctrl_c_stops_as_interrupted_with_the_rounds_done() -> None:
    result = _server(6, [_CtrlC()]).run()
    assert result.stop_reason == "interrupted" and result.rounds_run == 2
