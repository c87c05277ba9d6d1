"""A coordinator that dies at ANY stage of a round and resumes from its checkpoint (issue 14), and
one that "crashes" on purpose to get a second sum, against the project's unmodified honest sites.

Adversary: the coordinator, alone (it may stop at any instant, keep an old checkpoint and run a
round again as often as it likes); the four sites are honest and keep running. Exhaustive over the
crash point: every job exchange of a round of a plan with masking + DP-SGD + dp.reproducible (four
train jobs, the update's five masking stages, the evaluation's five stages, its first carrying the
evaluate jobs), the crash falling either before the jobs reach the sites or after they answered:
28 points. One federation
plays several of them, one per round (round r's coordinator dies at its point and the next one
resumes from round r - 1's checkpoint). Checked:

(a) every site's update (and evaluation sums) of every round entered at most one aggregation;
(b) each site's epsilon is charged once per distinct round it trained (its ledger's rounds are the
    rounds ``site.db`` records, at most the plan's), and the coordinator's ledger of each site says
    the same epsilon;
(c) when every crash fell before the round's first layer setup reached a site, the final model and
    the history equal the uninterrupted run's.

And a coordinator that resumes AGAIN from a round checkpoint it kept is refused by every site.
"""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pytest

from fedsec.audit.log import read_events
from tests.fedsec.network.resume_harness import Federation

pytestmark = pytest.mark.slow
EXTRA = "[dp]\nreproducible = true\naccountant = \"rdp\"\n"  # rdp: each incarnation calibrates fast
ROUND = ["train"] * 4 + [f"layer/{s}" for s in ("advertise keys", "share keys", "masked input",
                                                "consistency check", "unmask")] * 2
ROUND[9] = "evaluate+layer/advertise keys"  # the evaluate jobs travel with the sum's first stage
SETUP = 5
"""The round's fifth exchange carries the update's layer setup."""
BEFORE_SETUP = [(k, after) for k in range(1, SETUP) for after in (False, True)] + [(SETUP, False)]
AFTER_SETUP = [(SETUP, True)] + [(k, after) for k in range(SETUP + 1, len(ROUND) + 1)
                                 for after in (False, True)]


def _history(path: Path) -> list[dict[str, str]]:
    rows = list(csv.DictReader(open(path)))
    for row in rows:
        row.pop("seconds")
    return rows


def _crash_every_round(federation: Federation, points: list[tuple[int, bool]], *, every: int = 1) -> dict:
    """Round 1 runs; the coordinator of round r = 2, 2 + every, 2 + 2 every, ... dies at the next
    of ``points`` and the next one resumes; the last one runs to the end. Checks (a) and (b) after
    every incarnation."""
    resume = False
    for i, (k, after) in enumerate(points):
        assert federation.coordinator(crash=(2 + i * every, k, after), resume=resume) is None
        resume = True
        _check_sites(federation)
    summary = federation.coordinator(resume=True)
    assert summary is not None and summary["rounds_run"] == federation.config.rounds
    _check_sites(federation)
    return summary


def _check_sites(federation: Federation) -> None:
    for name, site in federation.sites.items():
        assert len(site.handed) == len(set(site.handed)), name  # (a)
        rounds = site.state.contributed(site.sha)
        assert sorted(site.work.privacy.budget.charged) == rounds, name  # (b)
        assert len(rounds) <= federation.config.rounds


def _coordinators_epsilon(federation: Federation, name: str) -> float:
    events = [e for e in read_events(federation.out / "audit.db")
              if e.action == "epsilon" and e.payload().get("party") == name]
    return events[-1].payload()["epsilon"]


def test_the_stages_of_a_round_are_the_28_crash_points(tmp_path):
    federation = Federation(tmp_path / "d", rounds=2, extra=EXTRA)
    try:
        federation.coordinator()
    finally:
        federation.close()
    assert [s for s, r in federation.log if r == 2] == ROUND
    assert len(BEFORE_SETUP) + len(AFTER_SETUP) == 2 * len(ROUND)


def test_crashes_before_the_setup_lose_nothing(tmp_path):
    rounds = len(BEFORE_SETUP) + 1
    reference = Federation(tmp_path / "reference", rounds=rounds, extra=EXTRA)
    try:
        expected = reference.coordinator()
        spent = {n: s.work.privacy.budget.spent for n, s in reference.sites.items()}
    finally:
        reference.close()
    federation = Federation(tmp_path / "crashed", rounds=rounds, extra=EXTRA)
    try:
        summary = _crash_every_round(federation, BEFORE_SETUP)
        assert summary["model_sha256"] == expected["model_sha256"]  # (c)
        mine, theirs = _history(federation.out / "history.csv"), _history(reference.out / "history.csv")
        assert len(mine) == len(theirs) == rounds
        for a, b in zip(mine, theirs, strict=True):
            for key in a:
                if key in ("epsilon", "epsilon_rdp", "budget_remaining"):  # same ledger, last digits
                    assert math.isclose(float(a[key]), float(b[key]), rel_tol=1e-9, abs_tol=1e-9), key
                else:
                    assert a[key] == b[key], (a["round"], key, a[key], b[key])
        for name, site in federation.sites.items():
            assert site.state.contributed(site.sha) == list(range(1, rounds + 1))
            assert math.isclose(site.work.privacy.budget.spent, spent[name], rel_tol=1e-9)
            assert math.isclose(_coordinators_epsilon(federation, name), spent[name], rel_tol=1e-9)
    finally:
        federation.close()


def test_crashes_after_the_setup_lose_at_most_the_round_in_flight(tmp_path):
    """A crash every other round (three aborted rounds in a row would end the run)."""
    rounds = 2 * len(AFTER_SETUP) + 1
    federation = Federation(tmp_path / "d", rounds=rounds, extra=EXTRA)
    try:
        _crash_every_round(federation, AFTER_SETUP, every=2)
        history = _history(federation.out / "history.csv")
        assert [int(r["round"]) for r in history] == list(range(1, rounds + 1))
        crashed = set(range(2, rounds, 2))
        for row in history:  # the round in flight is lost, the others are whole
            if int(row["round"]) not in crashed:
                assert row["status"] == "ok" and int(row["participants"]) == 4, row
            else:  # every site's update of that round went into the dead coordinator's setup
                assert row["status"].startswith("aborted") and row["participants"] == "0", row
        for name, site in federation.sites.items():
            assert site.state.contributed(site.sha) == list(range(1, rounds + 1))
            assert {r for kind, r in site.handed if kind == "update"} <= set(range(1, rounds + 1))
            assert math.isclose(_coordinators_epsilon(federation, name), site.work.privacy.budget.spent,
                                rel_tol=1e-9)
    finally:
        federation.close()


def test_a_coordinator_replaying_a_consumed_round_from_an_old_checkpoint_is_refused(tmp_path):
    """It "crashes" in round 2, keeps the round-1 checkpoint, resumes to the end, then runs round 2
    again from the kept checkpoint: every site refuses to train it (its update was consumed), no
    update enters a second aggregation, and no site is charged again."""
    federation = Federation(tmp_path / "d", rounds=2, extra=EXTRA)
    try:
        assert federation.coordinator(crash=(2, 1, False)) is None
        kept = tmp_path / "kept.npz"
        shutil.copy(federation.out / "checkpoint.npz", kept)
        assert federation.coordinator(resume=True) is not None
        handed = {n: list(s.handed) for n, s in federation.sites.items()}
        spent = {n: s.work.privacy.budget.spent for n, s in federation.sites.items()}
        shutil.copy(kept, federation.out / "checkpoint.npz")
        again = federation.coordinator(resume=True)
        assert again is not None and again["rounds_run"] == 2
        history = _history(federation.out / "history.csv")
        assert history[-1]["status"].startswith("aborted") and history[-1]["participants"] == "0"
        for name, site in federation.sites.items():
            assert ("update", 2) in handed[name]
            assert site.handed == handed[name]  # nothing more went into any aggregation
            assert site.work.privacy.budget.spent == spent[name]
            assert site.state.contributed(site.sha) == [1, 2]
            assert math.isclose(_coordinators_epsilon(federation, name), spent[name], rel_tol=1e-9)
    finally:
        federation.close()
