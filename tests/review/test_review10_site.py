"""Review 10 (outside, adversarial): the site's side of session 10's two changes, a train job that
names its model by SHA-256 (``SiteWork.job_model``, ``held_model``) and an update session set up
before its training (``SiteJobs._set_up``'s late update input, ``late_update_setups``).

Adversary: the coordinator, lying in any message it sends (setups, stage labels, ``also`` parts,
bundled jobs, names); a site process may be restarted (a new ``Party`` over the same state
directory: ``site.db`` survives, memory does not). The sites are the project's UNMODIFIED site code
(``tests/fedsec/network/test_bundled_jobs.Party``: ``SiteJobs`` on a real ``Site``, ``SiteWork``,
``site.db``, the audit log), the sessions the project's ``MaskingCoordinator``
(``tests/fedsec/network/test_keys_ahead.Ring``).

Held (passing): a late update session of round r never takes an update of another round (the train
job's round differs from the setup's) and leaves it for the session that names it; an ``also`` part
for the update inside a statistics job takes nothing while the evaluation's sums are pending; a
round's old (late) session cannot be revived once a new session of that round consumed the update;
the held model is never changed by training and only a completed evaluation sets it; a named model
the site does not hold, a malformed name and a restart leave no record, charge and pending update;
late update setups for rounds outside 1..rounds or of any non-integer JSON write no row; a
hypothesis search over three late update sessions of rounds 2 and 3, train jobs of either round
bundled into any of their masked inputs and retrains on models the coordinator picks finds that
what a masked input took is always, bit for bit, an update the site trained for that session's
round, every sum exact, no (site, round) update in two sums.

Findings, fixed in session 10 (these tests were strict xfails and are now their regression
tests): R10-1 a train job refused as ``MalformedEnvelope`` for its generator state was recorded in
``site.db`` first (fixed: ``SiteWork.train_inputs`` checks it with the model, before the record);
R10-2 a setup naming a round that is a long JSON string made ``SiteJobs.run`` raise out of its
refusal handler (the site process died, exit 2) instead of refusing the job (fixed: the reason is
shown cut short).
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.network import demo, envelope
from fedsec.network.envelope import vector_bytes
from fedsec.network.site_state import MAX_LATE_SETUPS
from tests.fedsec.network.test_bundled_jobs import RUN, Party, evaluate_job, train_job
from tests.fedsec.network.test_keys_ahead import EVALUATED, NEXT, Ring, _keys
from tests.fedsec.network.test_two_sessions import KNOWN, layer

N = 3
NOT_PENDING = "the aggregation's setup names no pending contribution of this site"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> demo.Deployment:
    return demo.prepare(tmp_path_factory.mktemp("review10"), N, rounds=3, extra='[dp]\nmode = "none"\n')


def _rows(party: Party, table: str) -> list[tuple[Any, ...]]:
    return party.state._db.execute(f"SELECT * FROM {table}").fetchall()  # noqa: S608 (a fixed name)


def _open(deployment: demo.Deployment, ring: Ring, round_index: int, seed: int,
          purpose: str = "update") -> Any:
    work = ring.parties[0].site.work
    length = work.length if purpose == "update" else work.evaluation_length
    return layer(deployment, ring.config, seed).open(
        round_index, [ClientUpdate(c, np.zeros(length, np.float32), 1.0) for c in range(N)], purpose=purpose)


# --- Q1: the late update input -------------------------------------------------------------------


def test_a_late_update_session_never_takes_an_update_of_another_round(deployment, tmp_path):
    """Round 2's session set up ahead (keys agreed), then a round-3 train job bundled with its masked
    input: the stage is refused without consuming anything; the round-3 update stays pending and
    the round-3 session that names it takes it, once."""
    ring = Ring(deployment, tmp_path)
    try:
        upd = ring.updates[0]
        _keys(ring, upd)
        stage, out = upd.outgoing()
        assert stage == "masked input"
        party = ring.parties[0]
        got = ring.answer(0, *ring.job(0, "update", 3, stage, out[0], first=train_job(party, 3)))
        assert got == {} and ring.refusals == [NOT_PENDING]
        assert party.records() == ([3], [])  # trained (recorded), nothing consumed
        pending = party.site.work.pending
        assert pending is not None and (pending.purpose, pending.round) == ("update", 3)
        trained = pending.vector.copy()
        assert "update" not in party.jobs.layers
        # the session of round 3 names it (consumed at its setup)
        third = _open(deployment, ring, 3, 31)
        stage, out = third.outgoing()
        assert set(ring.answer(0, *ring.job(0, "update", 3, stage, out[0]))) == {"update"}
        assert party.records() == ([3], [("update", 3)])
        assert np.array_equal(party.jobs.layers["update"].vector, trained)
        # round 2's session again (its setup re-sent): a late setup, but nothing of round 2 pending
        again = _open(deployment, ring, NEXT, 32)
        stage, out = again.outgoing()
        assert set(ring.answer(0, *ring.job(0, "update", NEXT, stage, out[0]))) == {"update"}
        assert party.site.work.pending is None and party.records() == ([3], [("update", 3)])
    finally:
        ring.close()


def test_an_also_part_for_the_update_inside_a_statistics_job_takes_nothing_of_the_evaluation(
        deployment, tmp_path):
    """Both sessions set up before their input (round 1's evaluation, round 2's update), keys
    agreed. A statistics job with an ``evaluate`` job and the update's masked input as its ``also``
    part: the evaluation's sums go to the evaluation's session only, the update's part is refused
    (no round-2 update pending), and neither session gets the other's contribution afterwards."""
    ring = Ring(deployment, tmp_path)
    try:
        ring.evaluation_keys()
        upd = ring.updates[0]
        _keys(ring, upd)
        ev_stage, ev_out = ring.evaluation.outgoing()
        up_stage, up_out = upd.outgoing()
        assert ev_stage == up_stage == "masked input"
        party = ring.parties[0]
        got = ring.answer(0, *ring.job(0, "statistics", EVALUATED, ev_stage, ev_out[0],
                                       first=evaluate_job(party, EVALUATED),
                                       also=("update", up_stage, up_out[0])))
        assert set(got) == {"statistics"} and ring.refusals == [NOT_PENDING]
        assert party.records() == ([], [("evaluation", EVALUATED)])
        assert "update" not in party.jobs.layers
        # then a round-2 training pending and the evaluation's masked input relabelled as the
        # update's: refused (the update's layer is gone), the training stays pending, unconsumed
        ring.refusals.clear()
        answer, _ = party.send(*train_job(party, NEXT))
        assert answer["ok"] is True
        relabelled = ring.job(0, "update", NEXT, ev_stage, ev_out[0])
        assert ring.answer(0, *relabelled) == {}
        assert ring.refusals and party.records() == ([NEXT], [("evaluation", EVALUATED)])
        assert party.site.work.pending is not None and party.site.work.pending.purpose == "update"
    finally:
        ring.close()


def test_a_rounds_old_session_cannot_be_revived_after_a_new_session_consumed_its_update(deployment, tmp_path):
    """Round 2's session A set up during round 1's evaluation (late, keys agreed); the coordinator
    then opens a NEW round-2 session B with the train jobs bundled with B's first stage (the update
    consumed at B's setup) and completes it: B sums the honest updates. A's setup sent again is
    refused (the update is spent) before any session row; A's masked input has no layer to go to;
    A aborts; each site's round-2 update was consumed once."""
    ring = Ring(deployment, tmp_path, updates=2)
    try:
        a, b = ring.updates
        _keys(ring, a)
        stage, out = b.outgoing()
        replies = {}
        for c, message in out.items():
            party = ring.parties[c]
            ring.train(c)
            got = ring.answer(c, *ring.job(c, "update", NEXT, stage, message, first=train_job(party, NEXT)))
            replies[c] = got["update"]
        b.take(replies)
        ring.drive(b, NEXT)
        assert ring.outcome(b) == (0, 1, 2)
        assert ring.consumed() == [[("update", NEXT)]] * N
        sessions = [party.state._db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
                    for party in ring.parties]
        # A's first message (setup + advertise keys) again: refused, no session row written
        fresh = _open(deployment, ring, NEXT, 44)
        stage, out = fresh.outgoing()
        for c in range(N):
            assert ring.answer(c, *ring.job(c, "update", NEXT, stage, out[c])) == {}
        spent = f"this site's update of round {NEXT} already went into an aggregation"
        assert ring.refusals[-N:] == [spent] * N
        assert [party.state._db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
                for party in ring.parties] == sessions
        ring.drive(a, NEXT)
        assert ring.outcome(a) == "aborted"
        assert ring.consumed() == [[("update", NEXT)]] * N
    finally:
        ring.close()


@pytest.mark.parametrize("round_value", [0, -1, 4, 10**30, -(10**30), "2", 2.0, True, None, [2], {"r": 2}])
def test_late_update_setups_outside_the_plan_or_not_integers_write_no_row(deployment, tmp_path, round_value):
    """A setup for the update whose round is outside 1..rounds (negative, huge) or not a JSON
    integer (string, float, boolean, null, list, object): refused, no ``late_update_setups`` or
    ``sessions`` row, no layer; and at most :data:`MAX_LATE_SETUPS` a round for valid rounds,
    whatever the sessions."""
    party = Party(deployment, 0, tmp_path / "s")
    try:
        setup = {"layer": "masking", "purpose": "update", "round": round_value, "session": "11" * 16,
                 "certificates": {}}
        header = {"kind": "layer", "round": 1, "stage": "advertise keys", "purpose": "update"}
        answer, out = party.send(header, envelope.encode(setup, b""))
        assert answer["ok"] is False and out == b""
        assert _rows(party, "late_update_setups") == [] and _rows(party, "sessions") == []
        assert party.jobs.layers == {}
        for r in (1, 2, 3):
            for k in range(MAX_LATE_SETUPS + 2):
                setup = {"layer": "masking", "purpose": "update", "round": r, "session": f"{k:02x}" * 16,
                         "certificates": {}}
                party.send({"kind": "layer", "round": r, "stage": "advertise keys", "purpose": "update"},
                           envelope.encode(setup, b""))
        assert sorted(_rows(party, "late_update_setups")) == [(RUN, r, MAX_LATE_SETUPS) for r in (1, 2, 3)]
    finally:
        party.close()


# --- Q2: a model named by its digest -------------------------------------------------------------


def _model(party: Party, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return vector_bytes(rng.normal(0.0, 0.1, size=party.site.work.length).astype(np.float32))


def _named(round_index: int, digest: str, seed: int) -> tuple[dict[str, Any], bytes]:
    state = np.random.default_rng(seed).bit_generator.state
    return ({"kind": "train", "round": round_index, "rng": state, "head": None, "noise_multiplier": None,
             "model": digest}, b"")


def test_the_held_model_is_only_what_a_completed_evaluation_sent_and_training_never_changes_it(
        deployment, tmp_path):
    party = Party(deployment, 0, tmp_path / "s")
    twin = Party(deployment, 0, tmp_path / "t")
    try:
        a, b = _model(party, 1), _model(party, 2)
        assert party.send(*evaluate_job(party, 1))[0]["ok"] is True  # the zero model
        assert party.send({"kind": "evaluate", "round": 1}, a)[0]["ok"] is True  # evaluated again: holds a
        held = party.site.work.held_model
        assert held is not None and held[0] == hashlib.sha256(a).hexdigest()
        assert held[1].tobytes() == a
        # an evaluation refused (bad body, round outside the plan) leaves the held model as it was
        assert party.send({"kind": "evaluate", "round": 2}, b[:-4])[0]["ok"] is False
        assert party.send({"kind": "evaluate", "round": 9}, b)[0]["ok"] is False
        assert party.site.work.held_model[0] == hashlib.sha256(a).hexdigest()
        # b was never evaluated to completion: naming it is refused before any record
        answer, _ = party.send(*_named(2, hashlib.sha256(b).hexdigest(), 5))
        assert answer == {"job": answer["job"], "ok": False, "reason": "model.unknown"}
        assert party.records() == ([], [])
        assert party.site.work.pending is None or party.site.work.pending.purpose == "statistics"
        # train twice from the named model (a retrain) with two generators: each is what a twin sent
        # a's body trains, and the held model's values are a's bytes after both
        for seed in (5, 6):
            answer, _ = party.send(*_named(2, hashlib.sha256(a).hexdigest(), seed))
            assert answer["ok"] is True
            header, _ = _named(2, "", seed)
            header.pop("model")
            assert twin.send(header, a)[0]["ok"] is True
            assert party.site.work.pending.vector.tobytes() == twin.site.work.pending.vector.tobytes()
            assert party.site.work.held_model[1].tobytes() == a
        assert party.records()[0] == [2]
    finally:
        party.close()
        twin.close()


@pytest.mark.parametrize("lie", ["unknown", "upper", "short", "with body", "not a string"])
def test_a_named_model_refused_records_charges_and_leaves_nothing(deployment, tmp_path, lie):
    """Refused before ``site.db`` records the round (no ``contributions``/``trainings`` row), with
    no pending update and no bundled stage run; the held model unchanged. A restarted site (same
    ``site.db``, new process) holds none."""
    party = Party(deployment, 0, tmp_path / "s")
    try:
        a = _model(party, 1)
        assert party.send({"kind": "evaluate", "round": 1}, a)[0]["ok"] is True
        digest = hashlib.sha256(a).hexdigest()
        header, body = _named(1, digest, 3)
        header["model"] = {"unknown": hashlib.sha256(b"x").hexdigest(), "upper": digest.upper(),
                           "short": digest[:-1], "with body": digest, "not a string": [digest]}[lie]
        body = a if lie == "with body" else b""
        answer, _ = party.send(header, body)
        assert answer["ok"] is False
        assert answer["reason"] == ("model.unknown" if lie == "unknown" else "MalformedEnvelope")
        assert _rows(party, "contributions") == [] and _rows(party, "trainings") == []
        assert party.site.work.pending.purpose == "statistics"  # the evaluation's sums, untouched
        assert party.site.work.held_model[1].tobytes() == a
    finally:
        party.close()
    restarted = Party(deployment, 0, tmp_path / "s")
    try:
        assert restarted.site.work.held_model is None
        answer, _ = restarted.send(*_named(1, hashlib.sha256(a).hexdigest(), 3))
        assert answer["reason"] == "model.unknown" and _rows(restarted, "contributions") == []
    finally:
        restarted.close()


# --- findings --------------------------------------------------------------------------------------


def test_r10_1_a_train_job_with_a_malformed_generator_state_is_refused_before_it_is_recorded(
        deployment, tmp_path):
    party = Party(deployment, 0, tmp_path / "s")
    try:
        header, body = train_job(party, 1)
        header = {**header, "rng": {"bit_generator": "PCG64", "state": "not a state"}}
        answer, _ = party.send(header, body)
        assert answer["ok"] is False and answer["reason"] == "MalformedEnvelope"
        # as the model's own checks (job_model) are: refused before the round is recorded
        assert _rows(party, "contributions") == [] and _rows(party, "trainings") == []
    finally:
        party.close()


@pytest.mark.parametrize("purpose", ["update", "statistics"])
def test_r10_2_a_setup_with_a_long_non_integer_round_is_refused_not_fatal(deployment, tmp_path, purpose):
    party = Party(deployment, 0, tmp_path / "s")
    try:
        setup = {"layer": "masking", "purpose": purpose, "round": "9" * 70_000, "session": "11" * 16,
                 "certificates": {}}
        answer, out = party.send({"kind": "layer", "round": 1, "stage": "advertise keys", "purpose": purpose},
                                 envelope.encode(setup, b""))
        assert answer["ok"] is False and out == b""
        assert _rows(party, "late_update_setups") == [] and _rows(party, "late_setups") == []
    finally:
        party.close()


# --- a search over sessions of two rounds ---------------------------------------------------------


@st.composite
def _schedules(draw: st.DrawFn) -> list[tuple[int, int, bool]]:
    """Which of three update sessions (rounds 2, 2 and 3) steps next, the round of the train job
    (none, 2 or 3) the coordinator bundles into site 0's message of it, and whether it also trains
    site 0 on another model first (a retrain of that round, from a model the coordinator picks)."""
    return draw(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 2, 3]), st.booleans()),
                         min_size=1, max_size=10))


def _play(deployment: demo.Deployment, root: Any, schedule: list[tuple[int, int, bool]]) -> tuple[int, list]:
    """Three update sessions set up before their input (two of round 2, one of round 3), driven in
    any interleaving; site 0's messages carry train jobs of either round (or none), on models the
    coordinator varies. Whatever went into a session's masked input at a site is, bit for bit, an
    update that site trained for THAT session's round; each sum is exactly the sum of what its
    participants put in; no (site, round) update is in two sums; site.db consumes each once."""
    ring = Ring(deployment, root)
    try:
        sessions = [ring.updates[0], _open(deployment, ring, NEXT, 61), _open(deployment, ring, 3, 62)]
        rounds = [NEXT, NEXT, 3]
        nonce = [s.setups[0]["session"] for s in sessions]
        trained: dict[tuple[int, int], list[bytes]] = {}
        given_in: dict[tuple[int, int], tuple[bytes, int]] = {}
        """(session, site) -> the vector and weight its layer took."""
        models = iter(range(100, 10_000))

        def train(c: int, round_index: int, seed: int | None = None) -> tuple[dict[str, Any], bytes]:
            party = ring.parties[c]
            header, body = train_job(party, round_index)
            if seed is not None:
                body = _model(party, seed)
            return header, body

        for c, party in enumerate(ring.parties):  # every update a site's training leaves pending
            def spy(header: dict[str, Any], body: bytes, *, work: Any = party.site.work, c: int = c,
                    original: Any = party.site.work.train, **kwargs: Any) -> dict[str, Any]:
                extra = original(header, body, **kwargs)
                trained.setdefault((c, work.pending.round), []).append(work.pending.vector.tobytes())
                return extra

            party.site.work.train = spy  # type: ignore[method-assign]

        def taken(c: int) -> None:
            current = ring.parties[c].jobs.layers.get("update")
            if current is not None and current.vector is not None:
                k = nonce.index(current.setup["session"]) if current.setup["session"] in nonce else None
                if k is not None:
                    given_in.setdefault((k, c), (current.vector.tobytes(), current.weight))

        # then each session in turn to its end, site 0 trained for its round (a session whose layers
        # the others replaced aborts; one not started yet completes)
        finish = [(k, rounds[k], False) for k in range(3) for _ in range(5)]
        for k, train_round, retrain in itertools.chain(schedule, finish):
            if all(s.done for s in sessions):
                break
            session = sessions[k]
            if session.done:
                continue
            stage, out = session.outgoing()
            replies = {}
            for c, message in out.items():
                first = None
                if stage == "masked input":
                    if c == 0 and train_round:
                        if retrain:
                            ring.parties[0].send(*train(0, train_round, next(models)))
                        first = train(0, train_round, next(models))
                    elif c != 0:
                        first = train(c, rounds[k])
                job_round = rounds[k] if first is None else first[0]["round"]  # a bundle's is its job's
                got = ring.answer(c, *ring.job(c, "update", job_round, stage, message, first=first))
                taken(c)
                if "update" in got:
                    replies[c] = got["update"]
            session.take(replies)
        summed: list[tuple[int, int]] = []
        completed = 0
        clip = ring.config.secure.clip
        for k, session in enumerate(sessions):
            try:
                result = session.result()
            except ProtocolAbort:
                continue
            total = np.zeros(ring.parties[0].site.work.length)
            weight = 0
            for c in result.participants:
                vector, w = given_in[(k, c)]
                assert vector in trained[(c, rounds[k])]  # an update of this session's round
                total += w * np.clip(np.frombuffer(vector, np.float32).astype(np.float64), -clip, clip)
                weight += w
                summed.append((c, rounds[k]))
            assert result.total_weight == weight, (result.total_weight, weight)
            assert np.allclose(result.weighted_sum, total, atol=1e-3 * weight)
            completed += 1
        assert len(summed) == len(set(summed))
        for used in ring.consumed():
            assert len(used) == len(set(used))
        assert set(ring.refusals) <= KNOWN | {NOT_PENDING, "MalformedEnvelope", "rounds.retrained",
                                              "rounds.replayed"} | {
            f"this site's update of round {r} already went into an aggregation" for r in (NEXT, 3)} | {
            f"this site set up {MAX_LATE_SETUPS} sums of its update of round {r} before their input, "
            f"the most it sets up" for r in (NEXT, 3)}, \
            set(ring.refusals)
        return completed, sorted(summed)
    finally:
        ring.close()


@pytest.mark.slow
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schedule=_schedules())
def test_search_sessions_of_two_rounds_never_sum_an_update_of_another_round_or_twice(
        deployment, tmp_path_factory, schedule):
    _play(deployment, tmp_path_factory.mktemp("r10search"), schedule)


@pytest.mark.parametrize("schedule, completed, summed", [
    ([(2, 3, False)], 1, [(0, NEXT), (1, NEXT), (2, NEXT)]),  # round 3's set up, round 2's then completes
    # site 0 brings round 3's update to round 2's masked input (and round 2's to round 3's): refused,
    # and with 3 sites no sum survives a dropout after share keys
    ([(0, 0, False), (0, 0, False), (0, 3, True)], 0, []),
    ([(2, 0, False), (2, 0, False), (2, 2, False)], 0, []),
])
def test_the_search_sums_where_it_should(deployment, tmp_path, schedule, completed, summed):
    """The search's driver is not vacuous: a session completes with every site's update of its
    round; site 0's update of the other round keeps it out (no sum: 3 sites tolerate no dropout
    after share keys)."""
    assert _play(deployment, tmp_path, schedule) == (completed, summed)
