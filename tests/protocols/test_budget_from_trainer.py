"""The example-level budget is read from the DP-SGD trainer that runs, so it cannot account for one
batch size (or noise, or epoch count) while the clients train with another.

Issue 12's report: a hand-built PrivacyBudget with a wrong batch size reported epsilon 5.86 while
the trainer spent 7.53, without a word. Here the adversary is a misconfiguration that SEARCHES:
hypothesis draws the accounted settings and the settings training actually runs with; whenever they
differ, the budget must refuse to report (AccountingMismatch), and whenever they agree its epsilon
must equal the accountant's epsilon of what ran.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fedsec.dp import DPSGD, SecureRandom, epsilon
from fedsec.fl_core import ArrayDataset, RoundRecord
from fedsec.protocols.privacy import DPSGDTrainer, PrivacyBudget
from fedsec.protocols.privacy.budget import AccountingMismatch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn


def _trainer(batch_size: int, epochs: int = 1, sigma: float = 1.1) -> DPSGDTrainer:
    return DPSGDTrainer(DPSGD(noise_multiplier=sigma, max_grad_norm=1.0, batch_size=batch_size,
                              epochs=epochs, lr=0.1, random=SecureRandom.from_seed(0, "test")))


def _data(n: int) -> ArrayDataset:
    rng = np.random.default_rng(n)
    return ArrayDataset(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 2, n))


def _record(round_index: int) -> RoundRecord:
    return RoundRecord(round=round_index, accuracy=0.5, loss=0.7, train_loss=0.7, participants=1,
                       dropped=0, upload_bytes=0, seconds=0.0, update_norm=0.1)


def _round(budget: PrivacyBudget, trainer: DPSGDTrainer, sizes: list[int], r: int) -> RoundRecord:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    for n in sizes:
        trainer.train(model, _data(n), rng=np.random.default_rng(0))
    record = _record(r)
    budget.after_round(record)
    return record


def test_the_issue_case_a_budget_for_batch_16_while_training_with_batch_32_is_refused():
    trainer = _trainer(batch_size=16)
    budget = PrivacyBudget.for_trainer(trainer, [200], delta=1e-5, target_epsilon=0,
                                       accountant="rdp")
    trainer.optimizer.batch_size = 32  # the trainer that actually runs differs from the accounted one
    with pytest.raises(AccountingMismatch, match="sampling rate 0.16"):
        _round(budget, trainer, [200], 1)


def test_a_budget_from_the_trainer_reports_what_the_trainer_spent():
    trainer = _trainer(batch_size=32, epochs=2)
    budget = PrivacyBudget.for_trainer(trainer, [200, 120], delta=1e-5, target_epsilon=0,
                                       accountant="rdp")
    for r in (1, 2, 3):
        record = _round(budget, trainer, [200, 120], r)
    # the worst-off client: 120 examples, q = 32/120, 2 epochs x round(120/32) = 8 steps a round
    expected = epsilon(noise_multiplier=1.1, sample_rate=32 / 120, steps=3 * 8, delta=1e-5,
                       mechanism="rdp")
    assert record.metrics["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert record.metrics["sample_rate"] == pytest.approx(32 / 120)
    assert budget.trainer is trainer and trainer.reports == []


@settings(max_examples=12)
@given(n=st.integers(8, 60), accounted=st.tuples(st.integers(1, 40), st.integers(1, 2),
                                                 st.sampled_from([0.8, 1.3])),
       actual=st.tuples(st.integers(1, 40), st.integers(1, 2), st.sampled_from([0.8, 1.3])))
def test_searching_for_a_silent_mismatch_finds_none(n, accounted, actual):
    batch, epochs, sigma = accounted
    trainer = _trainer(batch, epochs, sigma)
    budget = PrivacyBudget.for_trainer(trainer, [n], delta=1e-5, target_epsilon=0, accountant="rdp")
    trainer.optimizer.batch_size, trainer.optimizer.epochs = actual[0], actual[1]
    trainer.optimizer.noise_multiplier = actual[2]
    ran = trainer.events(n)[0]
    same = ran == budget.profiles[0][0]
    if not same:
        with pytest.raises(AccountingMismatch):
            _round(budget, trainer, [n], 1)
        return
    record = _round(budget, trainer, [n], 1)
    expected = epsilon(noise_multiplier=ran.noise_multiplier, sample_rate=ran.sample_rate,
                       steps=ran.steps, delta=1e-5, mechanism="rdp")
    assert record.metrics["epsilon"] == pytest.approx(expected, rel=1e-9)


def test_the_configured_run_builds_its_budget_from_its_trainer():
    from fedsec.config import make_config
    from fedsec.experiment import build_experiment

    experiment = build_experiment(make_config({"rounds": 2, "secure.aggregation": "none",
                                               "train.batch_size": 24}))
    privacy = experiment.privacy
    assert privacy is not None and privacy.budget.trainer is privacy.trainer
    assert experiment.server.strategy.trainer is privacy.trainer
