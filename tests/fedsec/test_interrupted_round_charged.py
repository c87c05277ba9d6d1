"""A round interrupted (Ctrl-C) after the server received the updates is charged: under DP-SGD with
plain aggregation the server holds every client's noisy update in the clear once ``aggregate`` has
them, and under masking the unmasked sum once it returns; ``ChargeOnRelease`` charges the budget
before the interrupt propagates (``Server.run`` then drops the round in flight).
"""

import numpy as np
import pytest
from torch import nn

import fedsec
from fedsec import fl_core


class CtrlCAfterSeeing(fl_core.PlainAggregation):
    """The project's plain protocol; the server keeps what it is handed; the user presses Ctrl-C
    right after the server received round ``at``'s updates."""

    def __init__(self, at: int, **kw):
        super().__init__(**kw)
        self.seen, self.at = 0, at

    def aggregate(self, round_index, updates, *, purpose="update"):
        self.seen += len(updates)
        result = super().aggregate(round_index, updates, purpose=purpose)
        if purpose == "update" and round_index == self.at:
            raise KeyboardInterrupt
        return result


def _clients(k: int):
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(k):
        x = rng.normal(size=(40, 3)).astype(np.float32)
        clients.append((x, (x[:, 0] > 0).astype(np.int64)))
    return clients


def _run(protocol, rounds):
    clients = _clients(3)
    return fedsec.Federation(model=nn.Linear(3, 2), clients=clients, test=clients[0],
                             secure=protocol, dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0),
                             rounds=rounds, batch_size=8).run()


def test_updates_seen_in_an_interrupted_round_are_charged():
    protocol = CtrlCAfterSeeing(at=2)
    result = _run(protocol, rounds=3)
    assert protocol.seen == 6  # rounds 1 and 2: every client's noisy update, in the clear
    two = _run(fl_core.PlainAggregation(), rounds=2)
    assert result.epsilon == pytest.approx(two.epsilon), (
        f"the server received two rounds of DP-SGD updates in the clear; the interrupted run "
        f"reports epsilon {result.epsilon:.4f}, two charged rounds are {two.epsilon:.4f} "
        f"(stop: {result.stop_reason})")


def test_a_masked_sum_released_then_interrupted_is_charged():
    """Variant under masking: the sum is unmasked (released to the server), then Ctrl-C."""
    from fedsec.protocols.masked import MaskedAggregation

    class MaskedCtrlC(MaskedAggregation):
        def aggregate(self, round_index, updates, *, purpose="update"):
            result = super().aggregate(round_index, updates, purpose=purpose)
            if purpose == "update" and round_index == 2:
                raise KeyboardInterrupt  # the server already holds the unmasked sum
            return result

    result = _run(MaskedCtrlC(max_weight=40, rng=np.random.default_rng(1), active=False), rounds=3)
    two = _run(MaskedAggregation(max_weight=40, rng=np.random.default_rng(1), active=False), rounds=2)
    assert result.epsilon == pytest.approx(two.epsilon), (
        f"two sums released, epsilon {result.epsilon:.4f} reported, {two.epsilon:.4f} due")


def test_an_uninterrupted_run_is_charged_once_per_round():
    one, two = _run(fl_core.PlainAggregation(), rounds=1), _run(fl_core.PlainAggregation(), rounds=2)
    assert 0 < one.epsilon < two.epsilon
    assert [r["epsilon"] for r in two.history][0] == pytest.approx(one.epsilon)


def test_a_resumed_run_keeps_the_charge_of_the_release_interrupted_before_its_checkpoint(
        tmp_path, monkeypatch):
    """`fedsec run` (masking + DP-SGD) interrupted right after round 3's sum was released, then
    `--resume`: the resumed run re-runs round 3, so the released rounds are 1, 2, 3 (interrupted),
    3 again and 4. Its epsilon must be at least that of five charged rounds, never four's."""
    import json

    from fedsec.protocols.masked import MaskedAggregation

    from fedsec.cli import main

    settings = ["--quiet", "--set", "dp.noise_multiplier=1.0", "--set", "dp.target_epsilon=0"]
    real = MaskedAggregation.aggregate
    pressed = []

    def ctrl_c_after_round_3(self, round_index, updates, *, purpose="update"):
        result = real(self, round_index, updates, purpose=purpose)
        if purpose == "update" and round_index == 3 and not pressed:
            pressed.append(round_index)
            raise KeyboardInterrupt  # the server already holds round 3's unmasked sum
        return result

    monkeypatch.setattr(MaskedAggregation, "aggregate", ctrl_c_after_round_3)
    out = tmp_path / "cut"
    assert main(["run", "--out", str(out), "--set", "rounds=4", *settings]) == 130
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    resumed = json.loads((out / "summary.json").read_text())["privacy"]["epsilon"]
    epsilons = {}
    for rounds in (4, 5):
        ref = tmp_path / f"ref{rounds}"
        assert main(["run", "--out", str(ref), "--set", f"rounds={rounds}", *settings]) == 0
        epsilons[rounds] = json.loads((ref / "summary.json").read_text())["privacy"]["epsilon"]
    assert epsilons[4] < epsilons[5]
    assert resumed == pytest.approx(epsilons[5], rel=1e-6)
