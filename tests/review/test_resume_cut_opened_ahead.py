"""Review 8b, items 2-3: a coordinator killed while the round's evaluation sum is opened ahead (the
barrier cut: its advertise-keys and share-keys stages ride in the update's first two calls), then
resumed from its checkpoint (``run_coordinator`` with the checkpoint, as ``fedsec serve --resume``).

The project's crash search (``tests/fedsec/network/test_resume_crash_search.py``) does NOT play the
cut: its plan is DP-SGD under ``dp.reproducible`` (sites train one by one first, no evaluation opened
ahead), and its ``InProcessSite`` re-implements the site's job loop without ``also`` (with the cut,
every round of that harness aborts at advertise keys). Here the sites are the project's UNMODIFIED
``SiteJobs`` on real ``Site`` objects (``tests/fedsec/network/test_bundled_jobs.Party``), the
coordinator the project's ``Hub``/``run_coordinator`` with the crash-search harness's direct
mailboxes, and the plan DP-SGD without ``dp.reproducible``, where the cut runs (8 exchanges a round).

Checked: (1) a crash after ``RemoteRound.open_evaluation`` drew the evaluation's seeds from the
evaluation generator, before any job reached a site, loses nothing: the resumed run's run generator
and evaluation generator end where the uninterrupted run's do, and its history's participants,
statuses, evaluation sites and epsilon equal the uninterrupted run's; (2) a crash after call 1, 2 or
5 (both sessions set up at every site, between calls 2 and 6) loses only that round: every other
round is whole, each site's ``site.db`` consumes each (kind, round) once, its ledger charges exactly
the rounds it trained, and epsilon never decreases.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest

from fedsec.checkpoint import read_checkpoint
from fedsec.network import envelope
from tests.fedsec.network import resume_harness
from tests.fedsec.network.test_bundled_jobs import RUN, Party

pytestmark = pytest.mark.slow
EXTRA = "[dp]\naccountant = \"rdp\"\n"
ROUNDS = 3
CUT = ["train+layer/advertise keys", "layer/share keys", "layer/masked input", "layer/consistency check",
       "layer/unmask", "evaluate+layer/masked input", "layer/consistency check", "layer/unmask"]
AHEAD = ["train+layer/masked input", "layer/consistency check", "layer/unmask",
         "evaluate+layer/masked input", "layer/consistency check", "layer/unmask"]
"""A round after the first (session 10): its update's key stages rode in the round before's
evaluation calls (the evaluation's masked input and consistency check)."""
TRAINED_AHEAD = [*AHEAD[1:-1], "layer/unmask+train"]
"""A round after the first of a plan without DP (session 11): its training and its update's masked
input also rode in the round before's evaluation calls (the evaluation's unmask, ``+train``), and
so does the next round's training, but in the plan's last round."""
COLUMNS = ("round", "status", "participants", "dropped", "eval_sites", "epsilon", "epsilon_rdp", "steps")


class RealSite:
    """The project's ``SiteJobs`` behind the crash harness's direct mailboxes."""

    def __init__(self, d: Any, k: int) -> None:
        self.party = Party(d, k, d.state(k))
        self.name, self.work, self.state, self.sha = self.party.site.name, self.party.site.work, \
            self.party.state, RUN

    def answer(self, payload: bytes) -> bytes:
        header, body = envelope.decode(payload)
        round_index = header.get("round")
        if isinstance(round_index, bool) or not isinstance(round_index, int):
            round_index = None
        answer, out = self.party.jobs.run(header["job"], header, body, round_index)
        return envelope.encode(answer, out)

    def consumed(self) -> list[tuple[str, int]]:
        return self.party.records()[1]

    def close(self) -> None:
        self.party.close()


class Federation(resume_harness.Federation):
    def __init__(self, root: Path) -> None:
        super().__init__(root, rounds=ROUNDS, extra=EXTRA)
        for site in self.sites.values():
            site.close()
        self.sites = {s.name: RealSite(self.d, k) for k, s in enumerate(self.d.sites)}  # type: ignore[misc]


class Recorded(resume_harness.Federation):
    """Four unmodified sites (:class:`RealSite`) under the plan's ``extra``, and each (round,
    site)'s training generator state as its train job carried it (:attr:`training`), whether the
    job came alone or bundled with a stage."""

    def __init__(self, root: Path, *, extra: str) -> None:
        super().__init__(root, rounds=ROUNDS, extra=extra)
        for site in self.sites.values():
            site.close()
        self.sites = {s.name: RealSite(self.d, k) for k, s in enumerate(self.d.sites)}  # type: ignore[misc]
        self.training: dict[tuple[int, str], Any] = {}
        for site in self.sites.values():
            honest = site.answer

            def spy(payload: bytes, honest: Any = honest, name: str = site.name) -> bytes:
                header, _ = envelope.decode(payload)
                first = header.get("first") if isinstance(header.get("first"), dict) else header
                also = header.get("also") if isinstance(header.get("also"), dict) else {}
                for job in (first, also.get("train") or {}):  # also: a training speculated ahead
                    if job.get("kind") == "train":
                        self.training[(job["round"], name)] = job["rng"]
                return honest(payload)

            site.answer = spy  # type: ignore[method-assign]


def crashed_and_resumed(federation: resume_harness.Federation,
                        point: tuple[int, int, bool]) -> list[dict[str, str]]:
    """Crash ``federation``'s coordinator at ``point``, resume it to the end (the sites checked
    after each), and return the run's history (the plan's rounds, in order)."""
    assert federation.coordinator(crash=point) is None
    _check_sites(federation)
    summary = federation.coordinator(resume=True)
    assert summary is not None and summary["rounds_run"] == ROUNDS
    _check_sites(federation)
    history = _history(federation.out / "history.csv")
    assert [int(r["round"]) for r in history] == list(range(1, ROUNDS + 1))
    return history


def _history(path: Path) -> list[dict[str, str]]:
    return [{k: row[k] for k in COLUMNS} for row in csv.DictReader(open(path))]


def _generators(federation: Federation) -> tuple[Any, Any]:
    meta = read_checkpoint(federation.out).meta
    return meta["rng"], meta["extra"]["deployment.evaluation_rng"]


def _check_sites(federation: Federation) -> None:
    for name, site in federation.sites.items():
        used = site.consumed()
        assert len(used) == len(set(used)), name
        rounds = site.state.contributed(site.sha)
        if site.work.privacy is not None:
            assert sorted(site.work.privacy.budget.charged) == rounds, name
        assert len(rounds) <= ROUNDS


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    federation = Federation(tmp_path_factory.mktemp("ref") / "d")
    try:
        summary = federation.coordinator()
        history = _history(federation.out / "history.csv")
        return summary, history, list(federation.log), _generators(federation)
    finally:
        federation.close()


def test_the_plan_runs_the_cut_with_the_real_site_code(reference):
    _, history, log, _ = reference
    assert [s for s, r in log if r == 1] == CUT
    assert [s for s, r in log if r == 2] == [s for s, r in log if r == 3] == AHEAD
    assert all(row["status"] == "ok" and row["participants"] == "4" for row in history), history


def test_a_crash_after_the_evaluation_was_opened_ahead_and_before_any_job_loses_nothing(reference, tmp_path):
    _, theirs, _, generators = reference
    federation = Federation(tmp_path / "d")
    try:
        mine = crashed_and_resumed(federation, (2, 1, False))
        for a, b in zip(mine, theirs, strict=True):
            for key in COLUMNS:
                if key.startswith("epsilon"):
                    assert math.isclose(float(a[key]), float(b[key]), rel_tol=1e-9, abs_tol=1e-9), key
                else:
                    assert a[key] == b[key], (a["round"], key, a[key], b[key])
        assert _generators(federation) == generators  # the draw order of both generators is kept
    finally:
        federation.close()


@pytest.mark.parametrize("point", [(2, 1, True), (2, 2, True), (2, 4, True), (2, 5, True), (2, 6, True)])
def test_a_crash_between_calls_2_and_6_loses_only_that_round(point, tmp_path):
    federation = Federation(tmp_path / "d")
    try:
        history = crashed_and_resumed(federation, point)
        for row in history:
            if int(row["round"]) == 2:
                assert row["status"].startswith("aborted") and row["participants"] == "0", row
            else:
                assert row["status"] == "ok" and row["participants"] == "4", row
        epsilons = [float(r["epsilon"]) for r in history]
        assert all(b >= a for a, b in zip(epsilons, epsilons[1:])), epsilons
        for site in federation.sites.values():
            assert site.state.contributed(site.sha) == list(range(1, ROUNDS + 1))
            assert [r for kind, r in site.consumed() if kind == "update"] == [1, 2, 3]
    finally:
        federation.close()
