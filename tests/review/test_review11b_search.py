"""Review 11b, searching adversaries against the prefetched first call (``RemoteRound.prefetch``):

1. EXHAUSTIVE over coordinator crash points from round 1's evaluation unmask (call 8 of round 1,
   which carries round 2's training) to round 3's last call, before or after the sites answered,
   each resumed from the checkpoint (the harness counts a call at its post: with the prefetch,
   call 1 of round r + 1 is posted at the end of round r's evaluation, before round r's history
   row and checkpoint). Invariants: each site's ``site.db`` consumes each (kind, round) once; the
   history has every round; a lost round is an aborted row with no participant and an ``abort``
   event; the run generator ends on the uninterrupted run's; and the outcome is the one the same
   instant gives without the prefetch, which is the same call number except for call 1 of round
   r + 1, the instant right after round r's last call was answered (call 5, or 8 in round 1).
2. HYPOTHESIS over fault schedules on the prefetched calls of rounds 2 and 3 (a site refusing,
   answering garbage or a malformed envelope, going silent, or restarting between the post and the
   collect), with or without a stop after round 1 and with ``train.fraction`` 1 or 0.75: the run with
   the prefetch records what the run without it records (statuses, participants, eval_sites, run
   generator, ``site.db``; the evaluation generator too, after a stop since R11b-1's fix), and every
   site's consumption is once.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.network import envelope
from tests.review.test_resume_cut_opened_ahead import RealSite
from tests.review.test_review11_crash import PLAIN, ROUNDS, Plain
from tests.review.test_review11b_prefetch import (
    TARGET,
    Deferred,
    Outcome,
    check_sites,
    deferred,
    is_prefetched,
    junk_in_prefetched,
    rewrite_site,
    run,
)

pytestmark = pytest.mark.slow
POINTS = [(1, 8, False), (1, 8, True)] + [(r, k, after) for r in (2, 3) for k in range(1, 6)
                                          for after in (False, True)]
_cache: dict[Any, Any] = {}


def _outcome(prefetch: bool, point: tuple[int, int, bool]) -> Any:
    """The run crashed at ``point`` and resumed (or ``"unresumable"``: no checkpoint yet)."""
    key = (prefetch, point)
    if key not in _cache:
        with tempfile.TemporaryDirectory() as root:
            try:
                _cache[key] = run(Path(root) / "d", prefetch=prefetch, crash=point)
            except Exception as error:  # noqa: BLE001 - the resume's refusal: nothing checkpointed
                assert "holds no checkpoint" in str(error), error
                _cache[key] = "unresumable"
    return _cache[key]


def _uninterrupted() -> Outcome:
    if "ref" not in _cache:
        with tempfile.TemporaryDirectory() as root:
            _cache["ref"] = run(Path(root) / "d")
    return _cache["ref"]


def _same_instant(point: tuple[int, int, bool]) -> tuple[int, int, bool]:
    """The crash point of the run without the prefetch at the same instant."""
    r, k, _ = point
    if k == 1 and r >= 2:  # posted right after round r - 1's last call was answered
        return (r - 1, 8 if r == 2 else 5, True)
    return point


@pytest.mark.parametrize("point", POINTS, ids=[f"r{r}c{k}{'a' if a else 'b'}" for r, k, a in POINTS])
def test_search_coordinator_crashes_around_the_prefetched_call(point):
    on = _outcome(True, point)
    off = _outcome(False, _same_instant(point))
    if on == "unresumable":  # no round checkpointed yet: nothing to resume, as without the prefetch
        assert off == "unresumable"
        return
    assert off != "unresumable"
    check_sites(on)
    rows = on.rows()
    assert [int(r[0]) for r in rows] == list(range(1, ROUNDS + 1))
    aborted = {a[1] for a in on.events if a[0] == "abort"}
    for number, status, participants, _ in rows:
        assert status in ("ok", "aborted"), rows
        if status == "aborted":
            assert participants == "0" and int(number) in aborted, (rows, aborted)
    assert [r[:3] for r in rows] == [r[:3] for r in off.rows()]
    assert on.generators[0] == off.generators[0] == _uninterrupted().generators[0]
    for name, used in on.consumed.items():
        assert sorted(used) == sorted(off.consumed[name]), name


FAULTS = ["none", "refuses", "garbage", "malformed", "silent", "restarts"]


def _scheduled(root: Path, prefetch: bool, schedule: dict[int, tuple[int, str]], extra: str) -> Outcome:
    holder: list[Plain] = []
    restarted: set[int] = set()

    def fault_of(federation: Plain) -> None:
        holder.append(federation)
        for r, (k, fault) in schedule.items():
            if fault == "refuses":
                rewrite_site(federation, k, lambda h, rep, r=r: envelope.encode(
                    {"job": h["job"], "ok": False, "reason": "no"}) if is_prefetched(h, r) else rep)
            elif fault == "garbage":
                rewrite_site(federation, k, junk_in_prefetched(r))
            elif fault == "malformed":
                rewrite_site(federation, k, lambda h, rep, r=r: b"\x01" * 5 if is_prefetched(h, r) else rep)

    def between(box: Deferred, jobs: dict[str, tuple[int, bytes]]) -> set[str]:
        header = envelope.decode(next(iter(jobs.values()))[1])[0]
        box.hub.absent.clear()  # a silent site polls again (the harness's sites never poll)
        for r, (k, fault) in schedule.items():
            if not is_prefetched(header, r):
                continue
            fed = holder[0]
            name = fed.d.sites[k].name
            if fault == "silent":
                return {name}
            if fault == "restarts" and r not in restarted:
                restarted.add(r)
                fed.sites[name].close()
                fed.sites[name] = RealSite(fed.d, k)  # type: ignore[assignment]
                box.hub.joins[name] = box.hub.joins.get(name, 0) + 1
                if box.hub.standardization is not None:
                    fed.sites[name].answer(box.hub.job("standardize", 0, {}, box.hub.standardization)[1])
                return {name}
        return set()

    with deferred(between):
        return run(root, prefetch=prefetch, extra=extra, fault=fault_of)


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schedule=st.dictionaries(st.sampled_from([2, 3]),
                                st.tuples(st.integers(0, 3), st.sampled_from(FAULTS)), min_size=1),
       stop=st.booleans(), fraction=st.sampled_from(["1.0", "0.75"]))
def test_search_fault_schedules_on_the_prefetched_calls(schedule, stop, fraction):
    extra = (TARGET if stop else PLAIN) + ("" if stop else "[train]\n") + f"fraction = {fraction}\n"
    with tempfile.TemporaryDirectory() as root:
        on = _scheduled(Path(root) / "on", True, schedule, extra)
        off = _scheduled(Path(root) / "off", False, schedule, extra)
    assert off.prefetched == [] and on.prefetched and on.prefetched[0] == 2
    check_sites(on)
    assert on.rows() == off.rows()
    assert on.generators[0] == off.generators[0]
    assert on.generators[1] == off.generators[1]  # after a stop too, since R11b-1's fix
    assert {n: sorted(u) for n, u in on.consumed.items()} == {n: sorted(u) for n, u in off.consumed.items()}
    for r, (k, fault) in schedule.items():
        if fault in ("refuses", "malformed", "silent", "restarts") and r in on.prefetched:
            name = f"hospital-{'abcd'[k]}"
            # the site's dropout of that call is filed under its round, r (not r - 1, when it went out)
            sampled_or_all = [e for e in on.events if e[0] == "dropout" and e[3] == name
                              and e[2] in ("layer", "layer/statistics")]
            assert any(e[1] == r for e in sampled_or_all), sampled_or_all
            # none filed under the round whose end posted it (nor any round not faulted or after)
            faulted = {q for q, (j, _) in schedule.items() if j == k}
            assert {e[1] for e in sampled_or_all} <= faulted | {q + 1 for q in faulted}, sampled_or_all
