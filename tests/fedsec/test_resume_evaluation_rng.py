"""``fedsec run --resume`` of a csv run restores the federated evaluator's own generator (the
evaluation layer's rounding and ring draws), which the checkpoint carries as a :class:`SavedState`:
after a resumed run it is where the uninterrupted run's is, never a fresh ``[seed, 17]`` stream."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.fl_core.history import RoundObserver

from fedsec.checkpoint import read_checkpoint
from fedsec.config import load_config
from fedsec.experiment import _execute, build_experiment
from fedsec.site_data import EVALUATION_STREAM
from tests.fedsec.test_csv_run import write_shards

pytestmark = pytest.mark.slow


class _StopBefore(RoundObserver):
    """Ctrl-C just before round ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def before_round(self, round_index: int) -> str | None:
        if round_index == self.at:
            raise KeyboardInterrupt
        return None


def _evaluation_state(experiment):
    return next(s for s in experiment.saved if s.name == "evaluation_rng").get()


def test_the_csv_evaluators_generator_is_checkpointed_and_restored(tmp_path):
    write_shards(tmp_path)
    plan = tmp_path / "plan.toml"
    plan.write_text('rounds = 3\n[dp]\nreproducible = true\n[data]\ndataset = "csv"\nfiles = ["site0.csv", '
                    '"site1.csv", "site2.csv", "site3.csv"]\nlabel = "diagnosis"\nclasses = [0, 1]\n')
    config = load_config(str(plan))
    full = build_experiment(config)
    (tmp_path / "full").mkdir()
    _execute(full, tmp_path / "full")
    cut = build_experiment(config, observers=[_StopBefore(3)])
    (tmp_path / "cut").mkdir()
    assert _execute(cut, tmp_path / "cut")["stop_reason"] == "interrupted"
    checkpoint = read_checkpoint(tmp_path / "cut")
    saved = checkpoint.meta["extra"]["evaluation_rng"]
    assert saved != np.random.default_rng([config.seed, EVALUATION_STREAM]).bit_generator.state
    resumed = build_experiment(config)
    summary = _execute(resumed, tmp_path / "cut", checkpoint=checkpoint)
    assert summary["rounds_run"] == 3
    assert _evaluation_state(resumed) == _evaluation_state(full)
