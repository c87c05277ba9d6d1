"""The next round's training speculated during the evaluation (plans without DP): round r + 1's
``train`` jobs travel in the second part of round r's evaluation unmask call, before its update's
masked input (``also.train``); the round then begins at its consistency check, and nothing of it is
released before the server loop begins it. A round takes 5 exchanges instead of 6
(docs/deployment.md, "The next round's training speculated").

Adversary: the coordinator, with the sites' unmodified code (``SiteJobs`` on a real ``Site``,
``site.db``, audit log; ``test_bundled_jobs.Party``). It may put a training in any second part, of
any round, with any stage message, malformed or not, in any order and any number of times.

Properties:

1. The honest schedule sums the evaluation and the next round's update exactly, in 5 calls a site.
2. A training in a second part is run only before the input stage of an update layer of its round
   set up without its input; anything else is refused before the training is recorded, and the
   refusal touches the second part alone (the evaluation's stage is answered as without it). A
   malformed second part refuses the call.
3. A hypothesis search over calls that mix the evaluation's stages with second parts (with or
   without a training, of rounds 1-3, honest, replayed or relabelled) finds only typed refusals,
   each (kind, round) consumed once, and sums that are exactly the honest contributions of their
   participants.
4. The coordinator takes a speculated aggregation only when the server loop's round is the one
   trained ahead (sample, generators, model); otherwise it records why, and the round's sites,
   their update spent, are not asked to contribute it again (``test_keys_ahead`` covers the whole
   federation: its history and generators equal a run without keys ahead).
"""

from __future__ import annotations

import csv
import hashlib
import itertools
from typing import Any

import numpy as np
import pytest
from fedsec.fl_core.server import draw_round
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fedsec.audit.log import read_events
from fedsec.network import envelope
from fedsec.network.site import TRAIN_NOT_FOR_LAYER
from tests.fedsec.network.test_bundled_jobs import evaluate_job, train_job
from tests.fedsec.network.test_keys_ahead import EVALUATED, LATE, NEXT, NOT_PENDING, N, Ring, _opened_ahead
from tests.fedsec.network.test_keys_ahead import deployment as deployment  # noqa: F401 (the fixture)
from tests.fedsec.network.test_two_sessions import KNOWN

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def with_training(job: tuple[dict[str, Any], bytes], train: tuple[dict[str, Any], bytes]
                  ) -> tuple[dict[str, Any], bytes]:
    """``job`` (a ``layer`` job with a second part) with ``train`` carried before its second part's
    stage message, as the coordinator's hub builds it."""
    header, body = job
    also = header["also"]
    size = also["size"]
    header = {**header, "also": {**also, "train": train[0], "train_size": len(train[1]),
                                 "size": size + len(train[1])}}
    return header, body[:len(body) - size] + train[1] + body[len(body) - size:]


def speculated_call(ring: Ring, *, train: bool = True) -> dict[int, dict[str, bytes]]:
    """The evaluation's unmask call, whose second parts carry each site's round-2 training and its
    update's masked input; each site's replies by purpose."""
    ev, upd = ring.evaluation, ring.updates[0]
    stage, out = ev.outgoing()
    second, extra = upd.outgoing()
    assert (stage, second) == ("unmask", "masked input")
    got = {}
    for c in range(N):
        job = ring.job(c, "statistics", EVALUATED, stage, out[c], also=("update", second, extra[c]))
        if train:
            ring.train(c)  # the update the carried training computes (same model and generator)
            job = with_training(job, train_job(ring.parties[c], NEXT))
        got[c] = ring.answer(c, *job)
    ev.take({c: g["statistics"] for c, g in got.items() if "statistics" in g})
    upd.take({c: g["update"] for c, g in got.items() if "update" in g})
    return got


def test_the_speculated_schedule_sums_the_evaluation_and_the_next_update_in_five_calls(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        calls = ring.update_keys_in_evaluation_calls()
        speculated_call(ring)
        calls += N
        assert ring.evaluation.done and ring.updates[0].stage == "consistency check"
        calls += ring.drive(ring.updates[0], NEXT)  # the round, once the server loop begins it
        assert calls == 5 * N
        assert ring.outcome(ring.evaluation) == (0, 1, 2)
        assert ring.outcome(ring.updates[0]) == (0, 1, 2)
        assert ring.refusals == []
        assert ring.consumed() == [[("update", NEXT), ("evaluation", EVALUATED)]] * N
        assert [p.records()[0] for p in ring.parties] == [[NEXT]] * N
        assert all(p.jobs.layers == {} for p in ring.parties)
        # the training's events are of its round, not of the call's (the evaluation's)
        site = ring.parties[0].site
        assert site.audit is not None
        site.audit.head()  # every row before it is on disk
        events = read_events(site.paths.state / "audit.db")
        # ring.train's own, then the carried training's
        assert [e.round for e in events if e.action == "contribution"] == [NEXT, NEXT]
    finally:
        ring.close()


LIES = ["no update layer", "another round", "before its keys", "statistics", "input given"]


@pytest.mark.parametrize("lie", LIES)
def test_a_training_is_run_only_before_its_update_layers_input_stage(deployment, tmp_path, lie):
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        ev, upd = ring.evaluation, ring.updates[0]
        party = ring.parties[0]
        if lie != "before its keys":
            ring.update_keys_in_evaluation_calls()
        if lie == "no update layer":
            party.jobs.layers.pop("update")
        if lie == "input given":  # its masked input already went, with its training
            speculated_call(ring)
        purpose = "update"
        if lie == "input given":  # the input stage's label again, the evaluation over
            job = ring.job(0, "statistics", EVALUATED, "unmask", b"\x00",
                           also=("update", "masked input", b"\x00"))
        elif lie == "statistics":  # a second part for the evaluation, under an update's round
            stage, out = ev.outgoing()
            job = ring.job(0, "update", EVALUATED, "share keys", b"\x00", also=("statistics", stage, out[0]))
            purpose = "statistics"
        else:
            stage, out = ev.outgoing()
            second, extra = upd.outgoing()
            job = ring.job(0, "statistics", EVALUATED, stage, out[0], also=("update", second, extra[0]))
        train = train_job(party, NEXT + (lie == "another round"))
        rounds_before, used_before = party.records()
        answer, _ = party.send(*with_training(job, train))
        report = answer["also"]
        assert report["ok"] is False and report["size"] == 0
        assert report["reason"] == TRAIN_NOT_FOR_LAYER
        assert party.records() == (rounds_before, used_before)  # nothing trained or consumed
        assert purpose not in party.jobs.layers
        if lie == "input given":  # the refusal closed its layer: that sum goes on without it
            ring.drive(upd, NEXT)
            assert ring.outcome(upd) in ("aborted", (1, 2))
            assert party.records() == (rounds_before, used_before)
    finally:
        ring.close()


@pytest.mark.parametrize("change", [
    {"train": {"kind": "evaluate", "round": NEXT}},
    {"train": {"kind": "train", "round": True}},
    {"train": {"kind": "train", "round": NEXT, "job": 7}},
    {"train": ["train"]},
    {"train_size": -1},
    {"train_size": "0"},
    {"train_size": 10**9},
    {"extra": 1},
])
def test_a_malformed_training_part_refuses_the_call_and_records_nothing(deployment, tmp_path, change):
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        ring.update_keys_in_evaluation_calls()
        party = ring.parties[0]
        stage, out = ring.evaluation.outgoing()
        second, extra = ring.updates[0].outgoing()
        header, body = with_training(ring.job(0, "statistics", EVALUATED, stage, out[0],
                                              also=("update", second, extra[0])), train_job(party, NEXT))
        header = {**header, "also": {**header["also"], **change}}
        before = party.records()
        answer, _ = party.send(header, body)
        assert answer["ok"] is False and answer["reason"] == "MalformedEnvelope" and "also" not in answer
        assert party.records() == before
    finally:
        ring.close()


def test_a_refused_second_part_leaves_the_evaluations_answer_as_it_would_be(deployment, tmp_path):
    """Site 0's training names a round it has no layer of; its evaluation unmask is answered as
    the others' are, and the evaluation completes with every site."""
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        ring.update_keys_in_evaluation_calls()
        ev, upd = ring.evaluation, ring.updates[0]
        stage, out = ev.outgoing()
        second, extra = upd.outgoing()
        replies = {}
        for c in range(N):
            job = ring.job(c, "statistics", EVALUATED, stage, out[c], also=("update", second, extra[c]))
            job = with_training(job, train_job(ring.parties[c], NEXT + (c == 0)))
            got = ring.answer(c, *job)
            assert set(got) == ({"statistics"} if c == 0 else {"statistics", "update"})
            replies[c] = got["statistics"]
        ev.take(replies)
        assert ring.outcome(ev) == (0, 1, 2)
        assert ring.refusals == [TRAIN_NOT_FOR_LAYER]
    finally:
        ring.close()


@st.composite
def calls(draw: st.DrawFn) -> list[tuple[str, int | str | None]]:
    """What the coordinator does to site 0's second part in each call (the update's honest next
    message, a replay of site 0's last job, or the message relabelled), with a training of round 1,
    2 or 3 whatever its stage, or of round 2 at the update's masked input only (``"input"``, the
    honest schedule), or none; the other sites get the honest schedule."""
    return draw(st.lists(st.tuples(st.sampled_from(["honest", "honest", "replay", "relabel"]),
                                   st.sampled_from([None, "input", "input", NEXT, EVALUATED, NEXT + 1])),
                         min_size=1, max_size=8))


def _call(ring: Ring, c: int, stages: dict[str, tuple[str, dict[int, bytes]]],
          train_round: int | None) -> tuple[dict[str, Any], bytes] | None:
    """Site c's job of one call: the evaluation's stage (with its evaluate job at its masked input)
    and the update's as its second part, carrying a training of ``train_round``; the update's stage
    alone once the evaluation is done (its training bundled at its masked input)."""
    evaluation, update = stages.get("statistics"), stages.get("update")
    also = ("update", update[0], update[1][c]) if update is not None and c in update[1] else None
    if evaluation is not None and c in evaluation[1]:
        first = evaluate_job(ring.parties[c], EVALUATED) if evaluation[0] == "masked input" else None
        job = ring.job(c, "statistics", EVALUATED, evaluation[0], evaluation[1][c], first=first, also=also)
        if also is not None and train_round is not None:
            if train_round == NEXT and c not in ring.trained:
                ring.train(c)  # the update the carried training computes
            job = with_training(job, train_job(ring.parties[c], train_round))
        return job
    if also is None:
        return None
    first = None
    if also[1] == "masked input":
        if c not in ring.trained:
            ring.train(c)
        first = train_job(ring.parties[c], NEXT)
    return ring.job(c, "update", NEXT, also[1], also[2], first=first)


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schedule=calls())
@example(schedule=[("honest", "input")])
def test_search_trainings_in_second_parts_sum_honest_contributions_or_refuse_typed(
        deployment, tmp_path_factory, schedule):
    ring = Ring(deployment, tmp_path_factory.mktemp("search"))
    try:
        ring.evaluation_keys()
        ev, upd = ring.evaluation, ring.updates[0]
        last: tuple[dict[str, Any], bytes] | None = None
        steps = itertools.chain(schedule, itertools.repeat(("honest", "input")))
        for action, round_index in itertools.islice(steps, 12):
            live = [s for s in (ev, upd) if not s.done]
            if not live:
                break
            stages = {s.purpose: s.outgoing() for s in live}
            replies: dict[str, dict[int, bytes]] = {"update": {}, "statistics": {}}
            for c in range(N):
                at_input = stages.get("update", ("",))[0] == "masked input"
                chosen = round_index if c == 0 else "input"
                job = _call(ring, c, stages, (NEXT if at_input else None) if chosen == "input" else chosen)
                if c == 0 and action == "replay" and last is not None:
                    job = last
                elif c == 0 and action == "relabel" and job is not None and "also" in job[0]:
                    job = ({**job[0], "also": {**job[0]["also"], "stage": "unmask"}}, job[1])
                if job is None:
                    continue
                if c == 0:
                    last = job
                for purpose, reply in ring.answer(c, *job).items():
                    replies[purpose][c] = reply
            for session in live:
                session.take(replies[session.purpose])
        outcomes = [ring.outcome(s) if s.done else "open" for s in (ev, upd)]  # exact sums, or aborted
        if all(step == ("honest", "input") for step in schedule):  # the honest schedule: both complete
            assert outcomes == [(0, 1, 2), (0, 1, 2)] and ring.refusals == []
        for used in ring.consumed():
            assert len(used) == len(set(used))
            assert set(used) <= {("update", NEXT), ("evaluation", EVALUATED)}
        assert set(ring.refusals) <= KNOWN | LATE | {TRAIN_NOT_FOR_LAYER, NOT_PENDING, "MalformedEnvelope"}
    finally:
        ring.close()


def test_the_round_takes_a_speculated_aggregation_only_if_it_is_the_loops_round(deployment, tmp_path):
    """``_take_ahead`` after ``train_ahead``: each lie (another model, another training generator,
    a draw in between) leaves it untaken and recorded; the truth takes it, past its masked input."""
    for lie in ("none", "model", "generator", "drawn"):
        ring = Ring(deployment, tmp_path / lie)
        try:
            remote, session = _opened_ahead(deployment, ring)
            events: list[tuple[str, Any]] = []
            remote.hub.audit = type("Audit", (), {  # type: ignore[attr-defined]
                "event": lambda self, kind, **kw: events.append((kind, kw)), "head": lambda self: None})()
            assert remote.layer.context.config.dp.mode == "none"
            body = envelope.vector_bytes(remote.strategy.vector)
            remote.released = (body, hashlib.sha256(body).hexdigest())
            remote.hub.models, remote.hub.noise_multiplier = {}, None
            remote.hub.holds_model = lambda name, digest: False  # type: ignore[attr-defined]
            remote.strategy.pending = {}
            bundle = remote.train_ahead()
            assert bundle is not None and bundle.round_index == NEXT and remote.train_ahead() is None
            rng = remote.layer.context.rng
            selected, seeds = draw_round(rng, N, N)
            ids = [int(c) for c in selected]
            remote.strategy.pending = {c: np.random.default_rng(int(s)).bit_generator.state
                                       for c, s in zip(ids, seeds, strict=True)}
            if lie == "model":
                remote.strategy.vector = remote.strategy.vector + 1
            if lie == "generator":
                remote.strategy.pending[ids[0]] = np.random.default_rng(12345).bit_generator.state
            if lie == "drawn":
                rng.integers(0, 2)
            taken, trained = remote._take_ahead(NEXT, ids)
            if lie == "none":
                assert taken is session and trained and events == []
            else:
                assert taken is None and not trained
                stage = "masking/update (trained ahead)"
                assert [k for k, kw in events if kw.get("stage") == stage] == ["abort"]
        finally:
            ring.close()


@pytest.mark.slow
@pytest.mark.parametrize("point, lost", [((2, 2, False), [2]), ((2, 3, True), [2]), ((2, 5, True), [2, 3])])
def test_a_coordinator_crash_after_a_training_went_ahead_loses_its_round(tmp_path, point, lost):
    """The project's coordinator and four unmodified sites (``test_resume_cut_opened_ahead``),
    without DP, killed at ``point`` (round, call, after its answers) and resumed from its checkpoint:

    - before round 2's second call (its training went with round 1's last call, its first call,
      the consistency check, was posted at the end of round 1; round 1 is checkpointed), or once
      round 2 was released (its evaluation's first call answered, round 2 not yet checkpointed):
      round 2 is lost, the others are whole;
    - after round 2's last call was answered (round 2 released, round 3's training gone ahead,
      round 2 not yet checkpointed): rounds 2 and 3 are lost.

    A lost round is an aborted row: its sites refuse to retrain a released round, or to put an
    update already sent in a masked input into another sum. No (kind, round) is consumed twice."""
    from tests.review.test_resume_cut_opened_ahead import ROUNDS, Recorded, _check_sites

    federation = Recorded(tmp_path / "d", extra='[dp]\nmode = "none"\n')
    try:
        assert federation.coordinator(crash=point) is None
        _check_sites(federation)
        summary = federation.coordinator(resume=True)
        assert summary is not None and summary["rounds_run"] == ROUNDS
        history = list(csv.DictReader(open(federation.out / "history.csv")))
        assert [int(r["round"]) for r in history] == list(range(1, ROUNDS + 1))
        for row in history:
            if int(row["round"]) in lost:
                assert row["status"].startswith("aborted") and row["participants"] == "0", row
            else:
                assert row["status"] == "ok" and row["participants"] == "4", row
        _check_sites(federation)
        for site in federation.sites.values():
            assert [r for kind, r in site.consumed() if kind == "update"] == [1, 2, 3]
    finally:
        federation.close()


@pytest.mark.slow
def test_the_next_rounds_first_call_is_posted_before_the_round_before_is_recorded(tmp_path, monkeypatch):
    """``RemoteRound.prefetch``: round 2's first call (its consistency check) leaves before round 1's
    checkpoint is written, round 3's before round 2's; the run's history, samples, training seeds and
    both generators equal a run that posts each call only when its round begins."""
    from fedsec.checkpoint import CheckpointWriter
    from fedsec.network.remote import RemoteRound
    from tests.review.test_resume_cut_opened_ahead import Recorded, _generators

    write = CheckpointWriter.after_round
    runs = {}
    for name in ("prefetched", "plain"):
        federation = Recorded(tmp_path / name, extra='[dp]\nmode = "none"\n')

        def recorded(self: Any, record: Any, log: list[Any] = federation.log) -> None:
            log.append(("checkpoint", record.round))
            write(self, record)

        monkeypatch.setattr(CheckpointWriter, "after_round", recorded)
        if name == "plain":
            monkeypatch.setattr(RemoteRound, "prefetch", lambda self, round_index, evaluation: None)
        try:
            assert federation.coordinator() is not None
            history = list(csv.DictReader(open(federation.out / "history.csv")))
            runs[name] = (list(federation.log), [{k: r[k] for k in ("round", "status", "participants",
                                                                    "dropped", "eval_sites")}
                                                 for r in history],
                          _generators(federation), dict(federation.training))
        finally:
            federation.close()
    log, history, generators, training = runs["prefetched"]
    for r in (1, 2):
        first = log.index(("layer/consistency check", r + 1))
        assert first < log.index(("checkpoint", r)), log
        assert runs["plain"][0].index(("layer/consistency check", r + 1)) > runs["plain"][0].index(
            ("checkpoint", r))
    assert history == runs["plain"][1] and all(row["status"] == "ok" for row in history)
    assert generators == runs["plain"][2]
    assert training == runs["plain"][3] and len(training) == 12
