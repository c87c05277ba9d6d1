"""Review 11b (coordinator side): round r + 1's first call posted at the end of round r's evaluation
(``RemoteRound.prefetch``, commit 8d0d159) against an honest coordinator's faults, with the project's
coordinator (``run_coordinator``, ``Hub``, checkpoints, ``--resume``) and four UNMODIFIED sites
(``SiteJobs`` on real ``Site`` objects) behind the crash harness, under a plan without DP.

The reference for every run is the same run with ``RemoteRound.prefetch`` disabled (a no-op: round
r + 1's first call then goes out when the round begins, the 5-call schedule otherwise unchanged):
the prefetch is a latency change, so the history's statuses, participants and eval_sites, each
site's ``site.db`` and both generators must end where that run leaves them.

:class:`Deferred` mailboxes make a call's answers arrive at its collect, not at its post (the
harness's direct mailboxes answer at once), so that something can happen between the two (a site
restarts, a site never answers) as it does with the real mailboxes while the server loop records
round r.

Findings (strict xfails then; fixed in the same session, their tests regression tests now):

- R11b-1: the evaluation generator. ``prefetch`` opens round r + 1's evaluation
  (``open_evaluation``, drawing its rounding seeds and ring from the evaluation's own generator)
  BEFORE round r is recorded, so (a) a run that stops after round r (target accuracy) ends with the
  evaluation generator past the draws of an evaluation that never ran (the simulation's and the
  no-prefetch run's final state differ), and (b) round r's checkpoint holds the generator past
  round r + 1's evaluation draws: a coordinator resumed from it opens round r + 1's evaluation
  again and draws them twice; every crash-and-resume from round 2's first call on ends off the
  uninterrupted run's evaluation generator (the no-prefetch run's resume ends on it).
- R11b-2: the replies to a prefetched call that no round drives (a run that stops after round r:
  ``settle``) are collected and dropped: a site that answered it with garbage is recorded nowhere
  (driven, the same bytes are a ``misbehaved`` event of round r + 1): review 10's R10-3 again, for
  the prefetched call.
- Fixed: the early evaluation is opened from a copy of the evaluation generator, which moves past
  its draws only when round r + 1 opens its evaluation (``RemoteRound.open_evaluation(early=)``);
  the prefetched call's replies go to its aggregation before it is taken or refused, and
  ``settle`` records the aggregation's lost and misbehaving sites (``_record_ahead``).

Held: site silent / refusing / garbage / restarting between post and collect of the prefetched
call, round r's evaluation aborting in its unmask call, ``train.fraction`` 0.75,
``federation.train_ahead = false`` (nothing prefetched), the plan's last round (nothing prefetched),
the dropouts of the prefetched call filed under round r + 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedsec.audit.log import read_events
from fedsec.network import envelope
from fedsec.network.remote import RemoteRound
from tests.fedsec.network import resume_harness
from tests.review.test_resume_cut_opened_ahead import RealSite, _generators
from tests.review.test_review11_crash import PLAIN, ROUNDS, NotAhead, Plain, _history, rewrite_site

pytestmark = pytest.mark.slow
TARGET = PLAIN + "[train]\ntarget_accuracy = 0.05\n"


def is_prefetched(header: dict[str, Any], round_index: int) -> bool:
    """Round ``round_index``'s first call (the update's consistency check), as a site sees it."""
    return (header.get("kind") == "layer" and header.get("round") == round_index
            and header.get("stage") == "consistency check" and header.get("purpose") == "update")


class Deferred(resume_harness.DirectMailboxes):
    """Direct mailboxes whose sites answer a call at its collect (:meth:`collect`), not at its post;
    ``between(jobs)`` runs first and may return names whose answers never come (withdrawn)."""

    between: Callable[[dict[str, tuple[int, bytes]]], set[str]] | None = None
    hub: Any = None

    def send(self, jobs: dict[str, tuple[int, bytes]], deadline: float) -> Any:  # type: ignore[override]
        return jobs, deadline

    def collect(self, posted: Any) -> dict[str, bytes]:  # type: ignore[override]
        jobs, deadline = posted
        gone = self.between(jobs) if self.between is not None else set()
        answers = self.exchange({n: j for n, j in jobs.items() if n not in gone}, deadline)
        return answers


@contextlib.contextmanager
def deferred(between: Callable[[Deferred, dict[str, tuple[int, bytes]]], set[str]] | None = None
             ) -> Iterator[list[Deferred]]:
    """The harness's federation with :class:`Deferred` mailboxes (each one's hub set)."""
    made: list[Deferred] = []
    real_run = resume_harness.run_coordinator

    def factory(sites: Any, *, crash: Any, log: Any) -> Deferred:
        box = Deferred(sites, crash=crash, log=log)
        if between is not None:
            box.between = lambda jobs: between(box, jobs)
        made.append(box)
        return box

    def run(config: Any, hub: Any, out: Path, **kw: Any) -> Any:
        hub.mailboxes.hub = hub
        return real_run(config, hub, out, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(resume_harness, "DirectMailboxes", factory)
        mp.setattr(resume_harness, "run_coordinator", run)
        yield made


@dataclass
class Outcome:
    history: list[dict[str, str]]
    generators: Any
    consumed: dict[str, list[tuple[str, int]]]
    events: list[tuple[str, int | None, str | None, Any]]
    log: list[tuple[str, int | None]]
    prefetched: list[int]

    def rows(self) -> list[tuple[str, str, str, str]]:
        return [(r["round"], r["status"].split(":")[0], r["participants"], r["eval_sites"])
                for r in self.history]


def run(root: Path, *, prefetch: bool = True, extra: str = PLAIN, crash: Any = None,
        fault: Callable[[Plain], None] | None = None, cls: type[Plain] = Plain) -> Outcome:
    """One federation run (resumed from its checkpoint when it crashed at ``crash``)."""
    posted: list[int] = []
    real = RemoteRound.prefetch

    def spy(self: RemoteRound, round_index: int, evaluation: RemoteRound) -> None:
        real(self, round_index, evaluation)
        if self.prefetched is not None:
            posted.append(round_index)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RemoteRound, "prefetch", spy if prefetch else lambda self, r, e: None)
        federation = cls(root) if cls is not Plain else Plain(root, extra=extra)
        try:
            if fault is not None:
                fault(federation)
            summary = federation.coordinator(crash=crash)
            if crash is not None and summary is None:
                summary = federation.coordinator(resume=True)
            assert summary is not None
            events = [(e.action, e.round, e.stage, e.payload().get("site"))
                      for e in read_events(federation.out / "audit.db")]
            return Outcome(_history(federation.out / "history.csv"), _generators(federation),
                           {n: s.consumed() for n, s in federation.sites.items()}, events,
                           list(federation.log), posted)
        finally:
            federation.close()


def check_sites(outcome: Outcome) -> None:
    for name, used in outcome.consumed.items():
        assert len(used) == len(set(used)), (name, used)  # each (kind, round) consumed once


def same_as(a: Outcome, b: Outcome) -> None:
    """The prefetch changes nothing the run records (statuses, participants, eval_sites, both
    generators, what each site consumed)."""
    assert a.rows() == b.rows()
    assert a.generators[0] == b.generators[0]
    assert a.generators[1] == b.generators[1]
    assert {n: sorted(u) for n, u in a.consumed.items()} == {n: sorted(u) for n, u in b.consumed.items()}


def junk_in_prefetched(round_index: int) -> Callable[[dict[str, Any], bytes], bytes]:
    """A rewrite (:func:`rewrite_site`) of the answer to round ``round_index``'s prefetched call:
    ok, with bytes that are no consistency-check reply (the second part's reply kept)."""
    def junk(header: dict[str, Any], reply: bytes) -> bytes:
        if not is_prefetched(header, round_index):
            return reply
        head, body = envelope.decode(reply)
        size = head["also"]["size"] if isinstance(head.get("also"), dict) else 0
        return envelope.encode(head, b"\x00junk" * 7 + body[len(body) - size:])
    return junk


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    root = tmp_path_factory.mktemp("rev11b")
    return run(root / "on"), run(root / "off", prefetch=False)


def test_the_prefetch_runs_and_changes_nothing_recorded(references):
    on, off = references
    assert on.prefetched == [2, 3]  # rounds 2 and 3's first calls went out at the end of 1 and 2
    assert off.prefetched == []
    assert [s for s, r in on.log if r == 2][0] == "layer/consistency check"
    same_as(on, off)
    assert on.rows() == [(str(r), "ok", "4", "4") for r in range(1, ROUNDS + 1)]
    check_sites(on)
    # the plan's last round speculates nothing and posts nothing for a round 4
    assert not [r for _, r in on.log if r == ROUNDS + 1]
    assert not [e for e in on.events if e[0] == "abort"]


def test_r11b_1_a_stop_after_round_1_leaves_the_evaluation_generator_where_it_was(tmp_path):
    """``train.target_accuracy`` reached after round 1: round 2 never begins, but its evaluation was
    opened by the prefetch (its draws taken from the evaluation generator): the final checkpoint's
    evaluation generator is not the one a run without the prefetch (and the simulation) ends with."""
    on = run(tmp_path / "on", extra=TARGET)
    off = run(tmp_path / "off", extra=TARGET, prefetch=False)
    assert on.prefetched == [2] and on.rows() == off.rows() == [("1", "ok", "4", "4")]
    assert on.generators[0] == off.generators[0]  # the run generator: untouched (a copy drew)
    assert on.generators[1] == off.generators[1]


@pytest.mark.parametrize("point", [(2, 2, False), (2, 4, True), (3, 3, False)])
def test_r11b_1_a_resumed_coordinator_draws_the_evaluation_generator_once(references, tmp_path, point):
    """Killed inside round 2 or 3 (after round r - 1's checkpoint, which was written after the
    prefetch opened round r's evaluation) and resumed: the resumed run opens round r's evaluation
    again from the checkpointed generator, already past those draws. The same crash without the
    prefetch ends on the uninterrupted run's evaluation generator; with it, never."""
    on_ref, _ = references
    on = run(tmp_path / "on", crash=point)
    off = run(tmp_path / "off", crash=point, prefetch=False)
    check_sites(on)
    assert on.rows() == off.rows()
    assert off.generators[1] == on_ref.generators[1]  # the control: resumed, on the uninterrupted one
    assert on.generators[1] == off.generators[1]


def _silent(box: Deferred, jobs: dict[str, tuple[int, bytes]], *, name: str) -> set[str]:
    header = envelope.decode(next(iter(jobs.values()))[1])[0]
    return {name} if is_prefetched(header, 2) else set()


def _restart(box: Deferred, jobs: dict[str, tuple[int, bytes]], *, federation: list[Plain],
             k: int, done: list[int]) -> set[str]:
    """Site k restarts between the post and the collect of round 2's first call: it accepts the plan
    again (the hub counts a join, withdraws its job and sends it the feature scaling first)."""
    header = envelope.decode(next(iter(jobs.values()))[1])[0]
    if not is_prefetched(header, 2) or done:
        return set()
    done.append(1)
    fed = federation[0]
    name = fed.d.sites[k].name
    fed.sites[name].close()
    fed.sites[name] = RealSite(fed.d, k)  # type: ignore[assignment]
    hub = box.hub
    hub.joins[name] = hub.joins.get(name, 0) + 1
    if hub.standardization is not None:
        fed.sites[name].answer(hub.job("standardize", 0, {}, hub.standardization)[1])
    return {name}  # its job was withdrawn at its accept (Mailboxes.clear)


@pytest.mark.parametrize("fault", ["silent", "refuses", "garbage", "malformed", "restarts"])
def test_a_fault_on_the_prefetched_call_costs_what_it_costs_without_the_prefetch(tmp_path, fault):
    """Held: site 3 (site 0 for the restart) fails round 2's first call, in the time between its
    post (end of round 1) and its collect (round 2): the run records what the same fault records
    without the prefetch, each dropout of that call under round 2."""
    outcomes = []
    for prefetch in (True, False):
        holder: list[Plain] = []

        def fault_of(federation: Plain) -> None:
            holder.append(federation)
            if fault == "refuses":
                rewrite_site(federation, 3, lambda h, r: envelope.encode(
                    {"job": h["job"], "ok": False, "reason": "no"}) if is_prefetched(h, 2) else r)
            elif fault == "garbage":  # ok, with bytes that are no consistency-check reply
                rewrite_site(federation, 3, junk_in_prefetched(2))
            elif fault == "malformed":
                rewrite_site(federation, 3, lambda h, r: b"\x00" * 9 if is_prefetched(h, 2) else r)

        between = None
        if fault == "silent":
            def between(box, jobs):
                return _silent(box, jobs, name=holder[0].d.sites[3].name)
        elif fault == "restarts":
            done: list[int] = []

            def between(box, jobs):
                return _restart(box, jobs, federation=holder, k=0, done=done)
        with deferred(between):
            outcomes.append(run(tmp_path / str(prefetch), prefetch=prefetch, fault=fault_of))
        if fault == "restarts":
            assert done == [1]  # the restart happened, between that call's post and its collect
    on, off = outcomes
    # a silent site is absent until it polls again (never, behind these mailboxes): round 3 then
    # samples a site not connected, and is not trained ahead
    assert on.prefetched == ([2] if fault == "silent" else [2, 3]) and off.prefetched == []
    same_as(on, off)
    check_sites(on)
    name = "hospital-a" if fault == "restarts" else "hospital-d"
    mine = [e for e in on.events if e[3] == name and e[0] in ("dropout", "misbehaved")]
    assert any(e[1] == 2 for e in mine), mine
    # the prefetched call's own dropouts (the hub's, both parts) are filed under round 2, its round
    assert all(e[1] == 2 for e in mine if e[2] in ("layer", "layer/statistics")), mine
    assert sorted(mine) == sorted(e for e in off.events if e[3] == name and e[0] in ("dropout", "misbehaved"))


def test_the_evaluation_aborting_in_its_unmask_call_is_recorded_as_without_the_prefetch(tmp_path):
    """Held: sites 0 and 1 refuse round 1's evaluation unmask (its first part) but answer the second
    part (round 2's training and masked input): round 1's evaluation aborts, and the prefetch still
    posts round 2's first call (from ``aggregate``'s ``finally``); round 2 is whole; the run
    records what it records without the prefetch."""
    def fault(federation: Plain) -> None:
        def refuse(h: dict[str, Any], reply: bytes) -> bytes:
            if h.get("round") == 1 and h.get("stage") == "unmask" and h.get("purpose") == "statistics":
                head, body = envelope.decode(reply)
                return envelope.encode({**head, "ok": False, "reason": "no"}, body)
            return reply
        for k in (0, 1):
            rewrite_site(federation, k, refuse)

    on = run(tmp_path / "on", fault=fault)
    off = run(tmp_path / "off", fault=fault, prefetch=False)
    assert on.prefetched == [2, 3]
    assert ("abort", 1, "statistics", None) in on.events
    assert on.rows()[0][3] == "0" and on.rows()[1:] == [("2", "ok", "4", "4"), ("3", "ok", "4", "4")]
    same_as(on, off)
    check_sites(on)


def test_a_sample_of_three_prefetches_for_the_three(tmp_path):
    """Held: ``train.fraction = 0.75`` (3 of the 4 sampled a round): the prefetched call carries the
    update's consistency check to the sampled three and the evaluation's advertise keys to all four
    (the fourth as a job of its own); nothing recorded differs from the run without the prefetch."""
    extra = PLAIN + "[train]\nfraction = 0.75\n"
    on = run(tmp_path / "on", extra=extra)
    off = run(tmp_path / "off", extra=extra, prefetch=False)
    assert on.prefetched == [2, 3]
    same_as(on, off)
    assert [r[2] for r in on.rows()] == ["3"] * ROUNDS and [r[3] for r in on.rows()] == ["4"] * ROUNDS
    check_sites(on)


def test_train_ahead_off_prefetches_nothing(tmp_path):
    """Held: ``federation.train_ahead = false``: no training goes ahead, so nothing is prefetched."""
    off = run(tmp_path / "d", cls=NotAhead)
    assert off.prefetched == []
    assert not [s for s, _ in off.log if s.endswith("+train")]
    assert [r[1] for r in off.rows()] == ["ok"] * ROUNDS


def test_a_stop_after_round_1_collects_and_records_the_prefetched_call(tmp_path):
    """Held: the target reached after round 1: the prefetched call of round 2 is collected at the
    end (settle), a site silent there is a dropout of round 2, the round is recorded unbegun, and
    nothing of round 2 is released (no unmask of it goes out)."""
    holder: list[Plain] = []

    def between(box, jobs):
        return _silent(box, jobs, name=holder[0].d.sites[3].name)

    with deferred(between):
        on = run(tmp_path / "on", extra=TARGET, fault=holder.append)
    assert on.prefetched == [2]
    assert [s for s, r in on.log if r == 2] == ["layer/consistency check"]
    assert ("dropout", 2, "layer", "hospital-d") in on.events
    assert [e for e in on.events if e[0] == "abort"] == [("abort", 2, "masking/update (trained ahead)", None)]
    check_sites(on)


def test_r11b_2_garbage_in_a_prefetched_call_no_round_drives_is_recorded(tmp_path):
    """Site 3 answers round 2's prefetched consistency check ok, with bytes that are no reply; the
    run stops after round 1 (target): ``settle`` collects the call and gives the replies to its
    aggregation, so the site's misbehaviour is recorded under round 2, as when round 2 is driven
    (``test_a_fault_on_the_prefetched_call...[garbage]``). It was recorded nowhere (R11b-2)."""
    def fault(federation: Plain) -> None:
        rewrite_site(federation, 3, junk_in_prefetched(2))

    on = run(tmp_path / "on", extra=TARGET, fault=fault)
    assert on.prefetched == [2]
    # recorded under round 2: misbehaved, and out of that aggregation (a dropout of it), which was
    # never driven
    mine = [(e[0], e[1]) for e in on.events if e[3] == "hospital-d"]
    assert ("misbehaved", 2) in mine and all(r == 2 for _, r in mine), mine
