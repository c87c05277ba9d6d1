"""The update's keys agreed a round ahead: round r + 1's update aggregation is opened during round
r's evaluation, so its advertise-keys and share-keys stages ride in the evaluation's masked-input
and consistency-check calls, and round r + 1's ``train`` jobs then travel with its masked input.
A round takes 6 exchanges instead of 8 (docs/deployment.md).

Adversary: the coordinator, with the sites' unmodified code (``SiteJobs`` on a real ``Site``, its
``SiteWork``, ``site.db``, audit log; ``test_bundled_jobs.Party``). It may set up any number of
update sessions for a round before its training, drive their masked input with or without a
``train`` job, replay or relabel stages, and interleave two sessions of the same round.

Properties:

1. The honest schedule sums the evaluation and the next round's update exactly, in 6 calls a site
   for those 8 stages.
2. A site's update of a round goes into at most one aggregation. A masked input without its
   training is refused (the input is never invented), and a late update setup is refused once
   that round's update is spent, or past :data:`MAX_LATE_SETUPS` a round, before any session row
   is written.
3. A hypothesis search over two update sessions of one round, the train jobs and the lies above
   finds only typed refusals and sums that are exactly the honest updates of their participants.
4. The coordinator's side: a federation whose updates are opened ahead has the history, final
   model and generator states of one whose updates are not (``open_ahead`` disabled), and the
   ahead session is used only when the round's own draws call for it.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.fl_core.federated_eval import local_evaluation
from fedsec.fl_core.parameters import set_vector
from fedsec.fl_core.server import draw_round
from fedsec.protocols.errors import ProtocolAbort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.network import demo
from fedsec.network.layers.masking import MaskedSession
from fedsec.network.remote import RemoteRound
from fedsec.network.site_state import MAX_LATE_SETUPS
from tests.fedsec.network.test_bundled_jobs import Party, evaluate_job, train_job
from tests.fedsec.network.test_model_by_digest import _history
from tests.fedsec.network.test_two_sessions import KNOWN, answered, layer

N = 3
EVALUATED, NEXT = 1, 2
"""The round whose evaluation carries the keys, and the round whose update they are for."""
NOT_PENDING = "the aggregation's setup names no pending contribution of this site"
LATE = {f"this site's update of round {NEXT} already went into an aggregation",
        f"this site set up {MAX_LATE_SETUPS} sums of its update of round {NEXT} before their input, "
        f"the most it sets up"}
"""The late update setup's refusals (round 2's)."""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> demo.Deployment:
    return demo.prepare(tmp_path_factory.mktemp("ahead"), N, rounds=3, extra='[dp]\nmode = "none"\n')


class Ring:
    """N honest sites; round 1's evaluation session and round 2's update session(s), opened by the
    project's coordinator layers, none of them with a contribution pending at the sites."""

    def __init__(self, d: demo.Deployment, root: Path, *, updates: int = 1) -> None:
        self.parties = [Party(d, k, root / str(k)) for k in range(N)]
        self.config = self.parties[0].config
        work = self.parties[0].site.work
        self.evaluation = layer(d, self.config, 2).open(
            EVALUATED, [ClientUpdate(c, np.zeros(work.evaluation_length, np.float32), 1.0) for c in range(N)],
            purpose="statistics")
        self.updates = [layer(d, self.config, 10 + k).open(
            NEXT, [ClientUpdate(c, np.zeros(work.length, np.float32), 1.0) for c in range(N)],
            purpose="update") for k in range(updates)]
        self.sums = {}
        for c, p in enumerate(self.parties):  # what `evaluate` of the zero model gives each site
            w = p.site.work
            set_vector(w.model, np.zeros(w.length, dtype=np.float32))
            self.sums[c] = local_evaluation(w.model, w.test_data, n_classes=w.n_classes)
        self.trained: dict[int, tuple[np.ndarray, int]] = {}
        """Each site's round-2 update as its training left it pending (read before it is consumed)."""
        self.refusals: list[str] = []

    def close(self) -> None:
        for p in self.parties:
            p.close()

    def job(self, c: int, purpose: str, round_index: int, label: str, message: bytes, *,
            first: tuple[dict[str, Any], bytes] | None = None,
            also: tuple[str, str, bytes] | None = None) -> tuple[dict[str, Any], bytes]:
        header: dict[str, Any] = {"kind": "layer", "round": round_index, "stage": label, "purpose": purpose}
        body = message
        if first is not None:
            header.update(first=first[0], first_size=len(first[1]))
            body = first[1] + body
        if also is not None:
            header["also"] = {"purpose": also[0], "stage": also[1], "size": len(also[2])}
            body = body + also[2]
        return header, body

    def answer(self, c: int, header: dict[str, Any], body: bytes) -> dict[str, bytes]:
        return answered(self.parties[c], header, body, self.refusals)

    def train(self, c: int) -> None:
        """Site c's round-2 training alone (its update is read before anything consumes it)."""
        party = self.parties[c]
        answer, _ = party.send(*train_job(party, NEXT))
        assert answer["ok"] is True
        pending = party.site.work.pending
        self.trained[c] = (pending.vector.copy(), pending.weight)

    def evaluation_keys(self) -> None:
        """The evaluation's advertise keys and share keys (in the update's calls of round 1 in a
        deployment; here alone: no update of round 1 in this ring)."""
        ev = self.evaluation
        for _ in range(2):
            stage, out = ev.outgoing()
            ev.take({c: got["statistics"] for c in range(N)
                     if "statistics" in (got := self.answer(c, *self.job(c, "statistics", EVALUATED, stage,
                                                                           out[c])))})

    def honest(self) -> int:
        """The keys-ahead schedule from round 1's evaluation masked input to round 2's unmask; calls."""
        calls = self.update_keys_in_evaluation_calls()
        calls += self.drive(self.evaluation, EVALUATED)
        calls += self.drive(self.updates[0], NEXT, train=True)
        return calls

    def update_keys_in_evaluation_calls(self) -> int:
        """The evaluation's masked input (with its ``evaluate`` jobs) and consistency check, each
        call carrying round 2's update key stages as its second part; calls made."""
        ev, upd = self.evaluation, self.updates[0]
        calls = 0
        for with_evaluate in (True, False):  # masked input (+ evaluate), consistency check
            stage, out = ev.outgoing()
            second, extra = upd.outgoing()
            replies: dict[str, dict[int, bytes]] = {"update": {}, "statistics": {}}
            for c in range(N):
                first = evaluate_job(self.parties[c], EVALUATED) if with_evaluate else None
                got = self.answer(c, *self.job(c, "statistics", EVALUATED, stage, out[c], first=first,
                                               also=("update", second, extra[c])))
                calls += 1
                for purpose, reply in got.items():
                    replies[purpose][c] = reply
            ev.take(replies["statistics"])
            upd.take(replies["update"])
        return calls

    def drive(self, session: MaskedSession, round_index: int, *, train: bool = False) -> int:
        calls = 0
        while not session.done:
            stage, out = session.outgoing()
            replies = {}
            for c, message in out.items():
                first = None
                if train and stage == "masked input":  # bundled, as the coordinator sends it
                    party = self.parties[c]
                    self.train(c)  # the same update the bundled job trains (same model and generator)
                    first = train_job(party, NEXT)
                got = self.answer(c, *self.job(c, session.purpose, round_index, stage, message, first=first))
                calls += 1
                if session.purpose in got:
                    replies[c] = got[session.purpose]
            session.take(replies)
        return calls

    def outcome(self, session: MaskedSession) -> Any:
        try:
            result = session.result()
        except ProtocolAbort:
            return "aborted"
        assert len(set(result.participants)) == len(result.participants)
        if session.purpose == "statistics":
            total = sum(self.sums[c].astype(np.float64) for c in result.participants)
            assert np.allclose(result.weighted_sum, total, atol=1e-2)
            return result.participants
        clip = self.config.secure.clip
        total = sum(w * np.clip(v.astype(np.float64), -clip, clip) for c in result.participants
                    for v, w in [self.trained[c]])
        weight = float(sum(self.trained[c][1] for c in result.participants))
        assert result.total_weight == weight
        assert np.allclose(result.weighted_sum, total, atol=1e-3 * weight)
        return result.participants

    def consumed(self) -> list[list[tuple[str, int]]]:
        return [p.records()[1] for p in self.parties]


def test_the_keys_ahead_schedule_sums_the_evaluation_and_the_next_update_in_six_calls(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        assert ring.honest() == 6 * N
        assert ring.outcome(ring.evaluation) == (0, 1, 2)
        assert ring.outcome(ring.updates[0]) == (0, 1, 2)
        assert ring.refusals == []
        assert ring.consumed() == [[("update", NEXT), ("evaluation", EVALUATED)]] * N
        assert all(p.jobs.layers == {} for p in ring.parties)
    finally:
        ring.close()


def _keys(ring: Ring, session: MaskedSession) -> None:
    """A session's advertise keys and share keys, honestly, as layer jobs of their own."""
    for _ in range(2):
        stage, out = session.outgoing()
        session.take({c: got[session.purpose] for c in range(N)
                      if session.purpose in (got := ring.answer(c, *ring.job(c, session.purpose, NEXT, stage,
                                                                                out[c])))})


def test_a_masked_input_without_its_training_is_refused_and_the_others_are_summed(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        upd = ring.updates[0]
        _keys(ring, upd)
        stage, out = upd.outgoing()
        assert stage == "masked input"
        got = ring.answer(0, *ring.job(0, "update", NEXT, stage, out[0]))  # no train job: no input
        assert got == {} and ring.refusals == [NOT_PENDING]
        assert "update" not in ring.parties[0].jobs.layers and ring.consumed()[0] == []
        replies = {}
        for c in (1, 2):
            ring.train(c)
            replies[c] = ring.answer(c, *ring.job(c, "update", NEXT, stage, out[c]))["update"]
        upd.take(replies)
        ring.drive(upd, NEXT)
        assert ring.outcome(upd) in ((1, 2), "aborted")  # site 0 a dropout after its shares
        assert ring.consumed()[0] == [] and ring.consumed()[1] == [("update", NEXT)]
    finally:
        ring.close()


def test_two_update_sessions_of_a_round_get_its_update_once(deployment, tmp_path):
    ring = Ring(deployment, tmp_path, updates=2)
    try:
        first, second = ring.updates
        _keys(ring, first)
        _keys(ring, second)  # each site's setup of the second replaced its layer of the first
        for c in range(N):
            ring.train(c)
        ring.drive(second, NEXT)
        assert ring.outcome(second) == (0, 1, 2)
        assert ring.consumed() == [[("update", NEXT)]] * N
        ring.drive(first, NEXT)  # the replaced session's masked input: nothing more is taken
        assert ring.outcome(first) == "aborted"
        assert ring.consumed() == [[("update", NEXT)]] * N
        assert ring.refusals and set(ring.refusals) <= KNOWN
    finally:
        ring.close()


def _session_rows(party: Party) -> int:
    return party.state._db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]


def test_late_update_setups_are_bounded_and_end_once_the_update_is_spent(deployment, tmp_path):
    ring = Ring(deployment, tmp_path, updates=MAX_LATE_SETUPS + 1)
    try:
        party = ring.parties[0]
        for k, session in enumerate(ring.updates):
            stage, out = session.outgoing()
            rows = _session_rows(party)
            got = ring.answer(0, *ring.job(0, "update", NEXT, stage, out[0]))
            if k < MAX_LATE_SETUPS:
                assert set(got) == {"update"}
            else:  # refused before any key is drawn or session row written
                assert got == {} and ring.refusals[-1] == (
                    f"this site set up {MAX_LATE_SETUPS} sums of its update of round {NEXT} before their "
                    f"input, the most it sets up")
                assert _session_rows(party) == rows
        # another round's are counted apart; a spent update's round takes none
        other = layer(deployment, ring.config, 99).open(
            3, [ClientUpdate(c, np.zeros(party.site.work.length, np.float32), 1.0) for c in range(N)],
            purpose="update")
        stage, out = other.outgoing()
        answer, _ = party.send(*train_job(party, 3))
        assert answer["ok"] is True
        assert set(ring.answer(0, *ring.job(0, "update", 3, stage, out[0]))) == {"update"}  # names it
        assert ring.consumed()[0] == [("update", 3)]
        late = layer(deployment, ring.config, 98).open(
            3, [ClientUpdate(c, np.zeros(party.site.work.length, np.float32), 1.0) for c in range(N)],
            purpose="update")
        stage, out = late.outgoing()
        assert ring.answer(0, *ring.job(0, "update", 3, stage, out[0])) == {}
        assert ring.refusals[-1] == "this site's update of round 3 already went into an aggregation"
    finally:
        ring.close()


@st.composite
def plays(draw: st.DrawFn) -> list[tuple[int, str]]:
    """A schedule over two update sessions of round 2: which one steps next and what the coordinator
    does to site 0's message of it (nothing, train first, replay it, relabel it, route it to the
    other session's stage label)."""
    return draw(st.lists(st.tuples(st.integers(0, 1),
                                   st.sampled_from(["honest", "honest", "train", "train", "replay",
                                                    "relabel"])),
                         min_size=1, max_size=14))


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schedule=plays())
def test_search_two_sessions_of_a_round_sum_honest_updates_or_abort_typed(deployment, tmp_path_factory,
                                                                          schedule):
    ring = Ring(deployment, tmp_path_factory.mktemp("search"), updates=2)
    try:
        last: dict[int, tuple[dict[str, Any], bytes]] = {}
        steps = itertools.chain(schedule, itertools.cycle([(0, "train"), (1, "train")]))
        for index, action in itertools.islice(steps, 80):
            session = ring.updates[index]
            if all(s.done for s in ring.updates):
                break
            if session.done:
                continue
            stage, out = session.outgoing()
            replies = {}
            for c, message in out.items():
                job = ring.job(c, "update", NEXT, stage, message)
                if c == 0 and action == "replay" and index in last:
                    job = last[index]
                elif c == 0 and action == "relabel":
                    job = ({**job[0], "stage": "unmask" if stage != "unmask" else "advertise keys"}, job[1])
                if stage == "masked input" and (c != 0 or action == "train") and c not in ring.trained:
                    ring.train(c)  # once: a site trains its round once here
                if c == 0:
                    last[index] = job
                got = ring.answer(c, *job)
                if "update" in got:
                    replies[c] = got["update"]
            session.take(replies)
        outcomes = [ring.outcome(s) for s in ring.updates if s.done]
        summed = [c for o in outcomes if o != "aborted" for c in o]
        assert len(summed) == len(set(summed))  # no site's update in two sums
        for used in ring.consumed():
            assert len(used) == len(set(used)) and set(used) <= {("update", NEXT)}
        assert set(ring.refusals) <= KNOWN | LATE
    finally:
        ring.close()


@pytest.mark.slow
def test_a_federation_with_keys_ahead_runs_as_one_without(tmp_path, monkeypatch):
    """The project's coordinator (``run_coordinator``, ``Hub``) with four unmodified sites behind
    direct mailboxes (``test_resume_cut_opened_ahead``), no DP noise: rounds 2 and 3 take 5
    exchanges (their keys agreed and their training sent during the round before's evaluation);
    both generators end where a run without keys ahead (8 exchanges a round) leaves
    them, so every draw (samples, training seeds, sessions) came in the simulation's order, and
    the rounds' statuses and participants are that run's. (The sums themselves differ in their last
    bits between any two runs here: without ``dp.reproducible``, which needs DP-SGD and then trains
    site by site without keys ahead, each site draws its own rounding randomness.)"""
    from tests.review.test_resume_cut_opened_ahead import CUT, TRAINED_AHEAD, Recorded, _generators

    def federation(root: Path) -> Recorded:
        return Recorded(root, extra='[dp]\nmode = "none"\n')

    ahead = federation(tmp_path / "ahead")
    try:
        summary, log = ahead.coordinator(), list(ahead.log)
        history, generators = _history(ahead.out / "history.csv"), _generators(ahead)
    finally:
        ahead.close()
    monkeypatch.setattr(RemoteRound, "open_ahead", lambda self, round_index: None)
    plain = federation(tmp_path / "plain")
    try:
        reference, plain_log = plain.coordinator(), list(plain.log)
        assert summary is not None and reference is not None
        assert [s for s, r in log if r == 1] == [*CUT[:-1], "layer/unmask+train"]
        assert [s for s, r in log if r == 2] == TRAINED_AHEAD
        assert [s for s, r in log if r == 3] == [*TRAINED_AHEAD[:-1], "layer/unmask"]
        assert [s for s, r in plain_log if r in (1, 2, 3)] == CUT * 3
        assert [row["status"] for row in history] == ["ok"] * 3
        columns = ("round", "status", "participants", "dropped", "eval_sites", "failed_clients")
        assert [{k: r[k] for k in columns} for r in history] == \
            [{k: r[k] for k in columns} for r in _history(plain.out / "history.csv")]
        assert generators == _generators(plain)
        # the order, not only the count: every round's sample and training seeds are the same
        assert len(ahead.training) == 12 and ahead.training == plain.training
        assert summary["rounds_run"] == reference["rounds_run"] == 3
    finally:
        plain.close()


class _Hub:
    """The two facts of the coordinator's hub that taking an aggregation opened ahead reads (the
    roster's names, each site's join count) and what the round sets on it."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names, self.joins = names, {n: 1 for n in names}
        self.round = self.purpose = self.bundle = self.rider = None


class _Strategy:
    def __init__(self, length: int) -> None:
        self.vector = np.zeros(length, dtype=np.float32)


def _opened_ahead(deployment: demo.Deployment, ring: Ring) -> tuple[RemoteRound, MaskedSession]:
    """The project's ``RemoteRound.open_ahead`` for round 2 over the project's masking layer, its key
    stages answered by the ring's sites."""
    coordinator = layer(deployment, ring.config, 5)
    hub = _Hub(tuple(ring.config.federation.sites))
    remote = RemoteRound(layer=coordinator, hub=hub, strategy=_Strategy(ring.parties[0].site.work.length),  # type: ignore[arg-type]
                         deadline=1.0, sequential_noise=False, on_trained=lambda r, names: None)
    session = remote.open_ahead(NEXT)
    assert session is not None and remote.ahead is not None
    _keys(ring, session)
    return remote, session


@pytest.mark.parametrize("lie", ["none", "round", "sample", "drawn", "keys", "rejoined"])
def test_the_round_takes_the_aggregation_opened_ahead_only_where_its_own_draws_call_for_it(
        deployment, tmp_path, lie):
    ring = Ring(deployment, tmp_path)
    try:
        if lie == "keys":  # its share keys never answered: not every site is at its masked input
            coordinator = layer(deployment, ring.config, 5)
            remote = RemoteRound(layer=coordinator, hub=_Hub(tuple(ring.config.federation.sites)),  # type: ignore[arg-type]
                                 strategy=_Strategy(ring.parties[0].site.work.length), deadline=1.0,  # type: ignore[arg-type]
                                 sequential_noise=False, on_trained=lambda r, names: None)
            session = remote.open_ahead(NEXT)
        else:
            remote, session = _opened_ahead(deployment, ring)
        rng = remote.layer.context.rng
        untouched = rng.bit_generator.state
        selected, _ = draw_round(rng, N, N)  # the server loop's own draws for the round
        ids = [int(c) for c in selected]
        if lie == "drawn":
            rng.integers(0, 2)  # something drew from the run generator in between
        if lie == "sample":
            ids = ids[:-1]
        if lie == "rejoined":
            remote.hub.joins[remote.hub.names[1]] += 1
        at = rng.bit_generator.state
        taken, trained = remote._take_ahead(NEXT + (lie == "round"), ids)
        assert not trained  # its training was not sent with it (train_ahead)
        assert remote.ahead is None  # taken or dropped: never offered twice
        if lie == "none":
            assert taken is session
            # the run generator is where opening the aggregation now would have left it
            fresh = copy.deepcopy(untouched)
            replay = np.random.default_rng()
            replay.bit_generator.state = fresh
            draw_round(replay, N, N)
            layer(deployment, ring.config, 6).open(NEXT, [ClientUpdate(c, np.zeros(4, np.float32), 1.0)
                                                          for c in ids], purpose="update", rng=replay)
            assert rng.bit_generator.state == replay.bit_generator.state
        else:
            assert taken is None and rng.bit_generator.state == at  # the round opens its own
    finally:
        ring.close()


def test_no_aggregation_is_opened_ahead_past_the_plan_or_where_the_round_draws_its_own(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        config = ring.config
        client_level = dataclasses.replace(config, dp=dataclasses.replace(config.dp, mode="client"))
        cases = [(config, False, config.rounds + 1),  # past the plan's rounds
                 (config, False, 0),
                 (config, True, NEXT),  # reproducible DP-SGD: its sites train one by one first
                 (client_level, False, NEXT)]  # client-level DP: each update's noise drawn at its opening
        for plan, sequential, round_index in cases:
            coordinator = layer(deployment, plan, 5)
            remote = RemoteRound(layer=coordinator, hub=_Hub(tuple(plan.federation.sites)),  # type: ignore[arg-type]
                                 strategy=_Strategy(ring.parties[0].site.work.length), deadline=1.0,  # type: ignore[arg-type]
                                 sequential_noise=sequential, on_trained=lambda r, names: None)
            before = coordinator.context.rng.bit_generator.state
            assert remote.open_ahead(round_index) is None and remote.ahead is None
            assert coordinator.context.rng.bit_generator.state == before
    finally:
        ring.close()
