"""Review 11 (site side): a malicious coordinator against the speculated training of commit 12436bd.

The new surface: a ``layer`` job's second part (``header["also"]``) may carry the next round's
``train`` job (``also.train``, its body the part's first ``also.train_size`` bytes), which the
site runs (``SiteJobs._second``) before the update layer's input stage when it holds a late update
layer of that round at that stage; a refusal of either refuses the second part alone.

Adversary: the coordinator (any bytes, any order, any site), with the sites' UNMODIFIED code
(``SiteJobs`` on a real ``Site``, its ``SiteWork``, ``site.db`` and audit log:
``tests/fedsec/network/test_bundled_jobs.Party``); the coordinator's sessions are the project's
``MaskingCoordinator``/``MaskedSession`` (``tests/fedsec/network/test_two_sessions.layer``).

Findings, fixed in the same session (their tests, once strict xfails, are regression tests now):

- R11-1: ``also.train.round`` is only checked to be a Python ``int``; ``_second`` sets it as the
  round of every event of the part BEFORE checking it, so a round outside SQLite's 64-bit range
  (``2**63``) makes the refusal's own audit event raise ``ValueError`` out of the ``except``
  handler: it escapes ``SiteJobs.run`` and ends ``fedsec join`` (``Site._jobs`` has no handler).
- R11-2: the same unchecked round files the refusal (the update layer's ``abort``) under any round
  the coordinator names (``7`` of a 3-round plan, ``-1``): the site's log carries an event under a
  round that no job and no layer of the site was of.
- Fixed: ``_second`` files a refused training under the job's round and switches to the
  training's round only once the gate passed (then it is its layer's, a round of the plan);
  ``Site._jobs`` takes a job round outside [0, 2**63) as no round (the older variant of R11-1).

Held (plain tests): the honest speculated schedule sums exactly; a training that is not for a late
update layer at its input stage is refused before anything is recorded, and the primary part's
answer is the one a job without the second part gets; replays of the speculated call; a setup
smuggled in the second part; and a hypothesis search over mixed schedules (below).
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.audit.log import read_events
from fedsec.network import demo, envelope
from fedsec.network.envelope import vector_bytes
from fedsec.network.layers.base import SiteLayer
from fedsec.network.layers.masking import MaskedSession
from fedsec.network.site import EXIT_OK, TRAIN_NOT_FOR_LAYER
from fedsec.network.site_state import MAX_LATE_SETUPS, MAX_TRAININGS
from tests.fedsec.network.test_bundled_jobs import RUN, Party, evaluate_job, train_job
from tests.fedsec.network.test_keys_ahead import LATE, NOT_PENDING
from tests.fedsec.network.test_keys_ahead import Ring as KeysRing
from tests.fedsec.network.test_two_sessions import KNOWN, layer

N = 3
EVALUATED, NEXT = 1, 2


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> demo.Deployment:
    return demo.prepare(tmp_path_factory.mktemp("r11"), N, rounds=3, extra='[dp]\nmode = "none"\n')


def also_train(header: dict[str, Any], body: bytes, *, stage: str, message: bytes,
               train: tuple[dict[str, Any], bytes] | None,
               purpose: str = "update") -> tuple[dict[str, Any], bytes]:
    """``(header, body)`` with a second part for ``purpose``'s ``stage`` carrying ``train`` first,
    byte for byte as ``Hub.exchange(also_train=...)`` packs it."""
    second: dict[str, Any] = {"purpose": purpose, "stage": stage}
    part = message
    if train is not None:
        second.update(train=train[0], train_size=len(train[1]))
        part = train[1] + message
    return {**header, "also": {**second, "size": len(part)}}, body + part


class Ring(KeysRing):
    """``test_keys_ahead.Ring`` (round 1's evaluation, round 2's update session(s), N honest sites)
    with spies on what each site's layers are given: every contribution a layer takes as its input
    (``SiteLayer._spend``: at its setup or at its input stage), under the layer's session nonce."""

    def __init__(self, d: demo.Deployment, root: Path, *, updates: int = 1) -> None:
        super().__init__(d, root, updates=updates)
        self.inputs: list[tuple[int, str, str, Any, np.ndarray, int]] = []
        """(site, session nonce, purpose, round, vector, weight) of every input a layer took."""
        self.trained_last: dict[int, dict[int, bytes]] = {c: {} for c in range(N)}
        """Each site's last training of each round (its update's bytes), as its ``SiteWork`` left it."""
        for c, party in enumerate(self.parties):
            work = party.site.work
            honest = work.train

            def train(header: dict[str, Any], body: bytes, *, inputs: Any = None, honest: Any = honest,
                      c: int = c, work: Any = work) -> dict[str, Any]:
                out = honest(header, body, inputs=inputs)
                self.trained_last[c][int(header["round"])] = work.pending.vector.tobytes()
                return out

            work.train = train  # type: ignore[method-assign]

    def spend_spy(self) -> Any:
        ring, original = self, SiteLayer._spend

        def spend(layer_self: SiteLayer, vector: np.ndarray, weight: int) -> None:
            c = layer_self.context.client_id
            ring.inputs.append((c, str(layer_self.setup.get("session")), str(layer_self.setup.get("purpose")),
                                layer_self.setup.get("round"), np.array(vector), int(weight)))
            original(layer_self, vector, weight)

        return spend

    def speculated(self, *, train_for: dict[int, tuple[dict[str, Any], bytes] | None] | None = None,
                   primary_ok: set[int] | None = None) -> int:
        """Round 1's evaluation (masked input + evaluate, consistency check, unmask) carrying round
        2's update stages as in a deployment since session 11: advertise keys, share keys, then
        masked input WITH round 2's train job. ``train_for`` overrides a site's train job."""
        ev, upd = self.evaluation, self.updates[0]
        calls = 0
        for step in range(3):
            stage, out = ev.outgoing()
            second, extra = upd.outgoing()
            replies: dict[str, dict[int, bytes]] = {"update": {}, "statistics": {}}
            for c in range(N):
                first = evaluate_job(self.parties[c], EVALUATED) if step == 0 else None
                header, body = self.job(c, "statistics", EVALUATED, stage, out[c], first=first)
                train = None
                if step == 2:
                    train = train_job(self.parties[c], NEXT)
                    if train_for is not None and c in train_for:
                        train = train_for[c]
                header, body = also_train(header, body, stage=second, message=extra[c], train=train)
                got = self.answer(c, header, body)
                calls += 1
                for purpose, reply in got.items():
                    replies[purpose][c] = reply
                if primary_ok is not None and "statistics" in got:
                    primary_ok.add(c)
            ev.take(replies["statistics"])
            upd.take(replies["update"])
        calls += self.drive(ev, EVALUATED)
        calls += self.drive(upd, NEXT)
        return calls

    def summed(self, session: MaskedSession) -> Any:
        """The session's sum checked against the inputs the sites' layers of THAT session took (one
        each); 'aborted' for a typed abort."""
        try:
            result = session.result()
        except ProtocolAbort:
            return "aborted"
        nonce = session.setups[session.ids[0]]["session"]
        clip = self.config.secure.clip
        total, weight = 0.0, 0.0
        for c in result.participants:
            taken = [i for i in self.inputs if i[0] == c and i[1] == nonce]
            assert len(taken) == 1, (c, len(taken))
            _, _, purpose, _, vector, w = taken[0]
            v = vector.astype(np.float64)
            total = total + w * (np.clip(v, -clip, clip) if purpose == "update" else v)
            weight += w
        assert result.total_weight == weight
        assert np.allclose(result.weighted_sum, total, atol=1e-2 if session.purpose == "statistics"
                           else 1e-3 * weight)
        return result.participants


def _trainings(party: Party) -> dict[int, int]:
    return dict(party.state._db.execute("SELECT round, count FROM trainings").fetchall())


def test_the_speculated_schedule_sums_the_evaluation_and_the_next_rounds_training_exactly(
        deployment, tmp_path, monkeypatch):
    ring = Ring(deployment, tmp_path)
    monkeypatch.setattr(SiteLayer, "_spend", ring.spend_spy())
    try:
        ring.evaluation_keys()
        assert ring.speculated() == 5 * N
        assert ring.summed(ring.evaluation) == (0, 1, 2)
        assert ring.summed(ring.updates[0]) == (0, 1, 2)
        assert ring.refusals == []
        for c, party in enumerate(ring.parties):
            assert party.records() == ([NEXT], [("update", NEXT), ("evaluation", EVALUATED)])
            assert _trainings(party) == {NEXT: 1}  # trained once, in the speculated part
            # the masked input of round 2 carried exactly that training of round 2
            (update,) = [i for i in ring.inputs if i[0] == c and i[2] == "update"]
            assert update[3] == NEXT and update[4].tobytes() == ring.trained_last[c][NEXT]
    finally:
        ring.close()


def test_a_training_not_for_a_late_update_layer_at_its_input_is_refused_before_it_is_recorded(
        deployment, tmp_path):
    """The speculated training's gate: no update layer, a layer at another stage, a layer of another
    round, the statistics layer, a layer that already has its input. Each time: the second part is
    refused with the gate's reason, nothing is recorded in ``site.db`` (no contribution, no
    training count), and the primary part is answered as the same job without the second part."""
    ring = Ring(deployment, tmp_path, updates=2)
    try:
        party, twin = ring.parties[0], ring.parties[1]
        upd = ring.updates[0]
        stage, out = upd.outgoing()  # advertise keys: a late update layer of round 2 at site 0
        assert set(ring.answer(0, *ring.job(0, "update", NEXT, stage, out[0]))) == {"update"}
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("masked input", train_job(party, NEXT + 1)[0], "another round than the layer's"),
            ("share keys", train_job(party, NEXT)[0], "not the input stage (label)"),
            ("unmask", train_job(party, NEXT)[0], "a later stage"),
        ]
        before = (party.records(), _trainings(party))
        for label, train_header, why in cases:
            # primary: a statistics stage without a setup (refused the same way with or without a
            # second part); second: round 2's update stage with a training
            header = {"kind": "layer", "round": EVALUATED, "stage": "unmask", "purpose": "statistics"}
            body = b"x"
            plain = party.send(header, body)
            header2, body2 = also_train(header, body, stage=label, message=b"\x00" * 8,
                                        train=(train_header, train_job(party, NEXT)[1]))
            answer, extra = party.send(header2, body2)
            assert answer["also"]["ok"] is False, why
            assert answer["also"]["reason"] in (TRAIN_NOT_FOR_LAYER, "rounds.invalid"), (why, answer)
            assert (answer["ok"], answer.get("reason")) == (plain[0]["ok"], plain[0].get("reason")), why
            assert (party.records(), _trainings(party)) == before, why
            # re-arm: a fresh late layer of round 2 (its advertise keys) for the next case
            fresh = layer(deployment, ring.config, 40 + len(why)).open(
                NEXT, [ClientUpdate(c, np.zeros(party.site.work.length, np.float32), 1.0) for c in range(N)],
                purpose="update")
            s, o = fresh.outgoing()
            got = ring.answer(0, *ring.job(0, "update", NEXT, s, o[0]))
            if not got:  # MAX_LATE_SETUPS reached: the gate is then met by "no layer"
                assert ring.refusals[-1] in LATE
        # statistics purpose for the training (primary update, second statistics)
        header, body = {"kind": "layer", "round": NEXT, "stage": "unmask", "purpose": "update"}, b"x"
        answer, _ = party.send(*also_train(header, body, stage="masked input", message=b"y",
                                           purpose="statistics", train=train_job(party, NEXT)))
        assert answer["also"] == {"ok": False, "reason": TRAIN_NOT_FOR_LAYER, "size": 0}
        # a layer that already holds its input (set up naming a trained update): no second training
        answer, _ = twin.send(*train_job(twin, NEXT))
        assert answer["ok"] is True
        s, o = ring.updates[1].outgoing()
        assert set(ring.answer(1, *ring.job(1, "update", NEXT, s, o[1]))) == {"update"}  # names it
        count = _trainings(twin)
        header, body = {"kind": "layer", "round": EVALUATED, "stage": "unmask", "purpose": "statistics"}, b"x"
        answer, _ = twin.send(*also_train(header, body, stage="masked input", message=b"y",
                                          train=train_job(twin, NEXT)))
        assert answer["also"]["reason"] == TRAIN_NOT_FOR_LAYER and _trainings(twin) == count
        assert (party.records(), _trainings(party)) == before
    finally:
        ring.close()


def test_replaying_the_speculated_call_neither_retrains_nor_resubmits(deployment, tmp_path, monkeypatch):
    """The evaluation's unmask call with round 2's masked input + train, replayed verbatim to site 0
    (and again with a fresh job number): the layer took its input, so the gate refuses the
    training; ``site.db`` holds one training and one consumption of round 2, and the layers took
    one update input of round 2 per site in all."""
    ring = Ring(deployment, tmp_path)
    monkeypatch.setattr(SiteLayer, "_spend", ring.spend_spy())
    sent: list[tuple[dict[str, Any], bytes]] = []
    honest = ring.parties[0].send

    def spy(header: dict[str, Any], body: bytes) -> Any:
        if isinstance(header.get("also"), dict) and "train" in header["also"]:
            sent.append((header, body))
        return honest(header, body)

    ring.parties[0].send = spy  # type: ignore[method-assign]
    try:
        ring.evaluation_keys()
        ring.speculated()
        assert ring.summed(ring.updates[0]) == (0, 1, 2)
        (header, body), = sent
        for _ in range(2):
            answer, _ = honest(header, body)
            assert answer["also"]["ok"] is False
        assert _trainings(ring.parties[0]) == {NEXT: 1}
        assert ring.parties[0].records() == ([NEXT], [("update", NEXT), ("evaluation", EVALUATED)])
        assert len([i for i in ring.inputs if i[0] == 0 and i[2] == "update"]) == 1
    finally:
        ring.close()


def test_a_setup_smuggled_behind_a_speculated_training_spends_the_update_once(deployment, tmp_path,
                                                                              monkeypatch):
    """The gate reads the label and the layer held; the message may still carry a NEW setup (of a
    second session of round 2), which replaces the layer and names the update just trained. Held:
    that update goes into at most one layer (the new one, which then refuses the skipped stage, or
    is burnt), never into two sessions, and never into the first session's sum."""
    ring = Ring(deployment, tmp_path, updates=2)
    monkeypatch.setattr(SiteLayer, "_spend", ring.spend_spy())
    try:
        first, second = ring.updates
        party = ring.parties[0]
        from tests.fedsec.network.test_keys_ahead import _keys
        _keys(ring, first)  # site 0's layer of `first` at its masked input
        _, setup_messages = second.outgoing()  # carries site 0's setup of `second`
        header, body = {"kind": "layer", "round": EVALUATED, "stage": "unmask", "purpose": "statistics"}, b"x"
        answer, _ = party.send(*also_train(header, body, stage="masked input", message=setup_messages[0],
                                           train=train_job(party, NEXT)))
        updates = [i for i in ring.inputs if i[0] == 0 and i[2] == "update"]
        assert len(updates) <= 1
        assert party.records()[1].count(("update", NEXT)) <= 1
        # the first session's masked input now: site 0 has nothing more to give
        stage, out = first.outgoing()
        assert stage == "masked input"
        assert ring.answer(0, *ring.job(0, "update", NEXT, stage, out[0])) == {}
        assert len([i for i in ring.inputs if i[0] == 0 and i[2] == "update"]) == len(updates)
    finally:
        ring.close()


def test_the_primary_part_is_answered_whatever_the_speculated_part_does(deployment, tmp_path, monkeypatch):
    """Site 0's speculated training is for round 3 (a lie): its second part is refused, yet its
    evaluation (the primary part of the same calls) completes with all three sites, and round 2's
    sum holds the other two sites' trainings of round 2 exactly (or aborts typed)."""
    ring = Ring(deployment, tmp_path)
    monkeypatch.setattr(SiteLayer, "_spend", ring.spend_spy())
    try:
        ring.evaluation_keys()
        primary: set[int] = set()
        ring.speculated(train_for={0: train_job(ring.parties[0], NEXT + 1)}, primary_ok=primary)
        assert primary == {0, 1, 2}
        assert ring.summed(ring.evaluation) == (0, 1, 2)
        assert ring.summed(ring.updates[0]) in ((1, 2), "aborted")
        assert TRAIN_NOT_FOR_LAYER in ring.refusals
        assert ring.parties[0].state.contributed(RUN) == []
    finally:
        ring.close()


# ---------------------------------------------------------------------------------------------
# R11-1 and R11-2: the training's round was used before it was checked (fixed)


def _huge_round_job(party: Party, round_index: int) -> tuple[dict[str, Any], bytes]:
    train_header, train_body = train_job(party, NEXT)
    header, body = {"kind": "layer", "round": EVALUATED, "stage": "unmask", "purpose": "statistics"}, b"x"
    return also_train(header, body, stage="masked input", message=b"\x00" * 8,
                      train=({**train_header, "round": round_index}, train_body))


def test_r11_1_a_training_round_outside_64_bits_is_refused_not_raised(deployment, tmp_path):
    party = Party(deployment, 0, tmp_path / "s")
    try:
        answer, out = party.send(*_huge_round_job(party, 2**63))  # secure: a refused second part
        assert answer["also"]["ok"] is False and out == b""
        assert party.records() == ([], [])
    finally:
        party.close()


def test_r11_1_the_sites_job_loop_survives_a_training_round_outside_64_bits(deployment, tmp_path):
    """The real ``Site._jobs`` loop (what ``fedsec join`` runs after accepting), its calls answered by
    the coordinator: one crafted job, then ``done``. Secure: the job is answered (refused) and the
    loop ends with EXIT_OK at ``done``."""
    party = Party(deployment, 0, tmp_path / "s")
    header, body = _huge_round_job(party, 2**63)
    jobs = iter([envelope.encode({**header, "job": 11}, body),
                 envelope.encode({"kind": "done", "job": 12, "summary": {}})])
    answers: list[dict[str, Any]] = []

    def call(topic: str, payload: bytes, *, round_index: Any = None, deadline: Any = None,
             record: bool = True) -> bytes:
        if topic == "answer":
            answers.append(envelope.decode(payload)[0])
        return next(jobs)

    party.site.call = call  # type: ignore[method-assign]
    party.site.out = io.StringIO()
    try:
        code = party.site._jobs(party.config, RUN, party.state)
        assert code == EXIT_OK and answers and answers[0]["also"]["ok"] is False
    finally:
        party.close()


def test_r11_1_the_sites_job_loop_survives_a_job_round_outside_64_bits(deployment, tmp_path):
    party = Party(deployment, 0, tmp_path / "s")
    jobs = iter([envelope.encode({"kind": "evaluate", "round": 2**63, "job": 3}, b""),
                 envelope.encode({"kind": "done", "job": 4, "summary": {}})])

    def call(topic: str, payload: bytes, *, round_index: Any = None, deadline: Any = None,
             record: bool = True) -> bytes:
        return next(jobs)

    party.site.call = call  # type: ignore[method-assign]
    try:
        assert party.site._jobs(party.config, RUN, party.state) == EXIT_OK
    finally:
        party.close()


@pytest.mark.parametrize("claimed", [7, -1, 0])
def test_r11_2_a_refused_training_is_not_filed_under_a_round_nothing_was_of(deployment, tmp_path, claimed):
    """Site 0 holds no layer; the job is of round 1; the training claims round ``claimed`` (outside
    the plan's 1..3). Secure: no event of the site's log is filed under ``claimed``."""
    party = Party(deployment, 0, tmp_path / "s")
    try:
        answer, _ = party.send(*_huge_round_job(party, claimed))
        assert answer["also"]["ok"] is False
        rounds = {e.round for e in read_events(tmp_path / "s" / "audit.db")}
        assert claimed not in rounds, sorted(r for r in rounds if r is not None)
    finally:
        party.close()


# ---------------------------------------------------------------------------------------------
# The searching adversary


SESSIONS = ("E1", "U2a", "U2b", "U3")
"""The coordinator's sessions: round 1's evaluation, two update sessions of round 2, one of round 3."""
PIPELINES: dict[str, list[tuple[Any, Any, Any, bool]]] = {
    # round 1's evaluation carrying round 2's update, speculated as since 12436bd
    "A": [("E1", None, None, False), ("E1", None, None, False), ("E1", "U2a", None, True),
          ("E1", "U2a", None, False), ("E1", "U2a", NEXT, False), ("U2a", None, None, False),
          ("U2a", None, None, False)],
    # a competing session of round 2, its keys alone, its masked input with a bundled training
    "B2": [(None, "U2b", None, False)] * 2 + [(None, "U2b", NEXT, False)] + [("U2b", None, None, False)] * 2,
    # round 3's session the same way
    "B3": [(None, "U3", None, False)] * 2 + [(None, "U3", 3, False)] + [("U3", None, None, False)] * 2,
}
"""Each honest pipeline: (primary session, second session, training round of the second part,
evaluate bundled with the primary part), one call to every site of the sessions per step."""
MUTATIONS = ("honest", "honest", "honest", "replay", "relabel", "shift", "untrained", "late")
GATE = {TRAIN_NOT_FOR_LAYER, "rounds.invalid", "rounds.replayed", "rounds.retrained", "rounds.plan",
        "evaluation.round", "model.unknown", "MalformedEnvelope",
        # the late-setup rules for the search's round-3 session (LATE is round 2's)
        f"this site's update of round {NEXT + 1} already went into an aggregation",
        f"this site set up {MAX_LATE_SETUPS} sums of its update of round {NEXT + 1} before their input, "
        f"the most it sets up"}


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """A schedule: the three honest pipelines interleaved in any order, with adversarial steps (any
    primary session, any second session, a training of round 0..4 or none, an evaluate job)
    inserted anywhere, and on each step what the coordinator does to SITE 0's job: honest, replay
    its previous job, relabel its second part as the masked input, train it for the next round
    instead, send the input stage without the training, or train it for the round before."""
    out = []
    for choice in draw(st.lists(st.sampled_from(["A", "A", "A", "B2", "B3", "B3", "X"]), max_size=24)):
        mutation = draw(st.sampled_from(MUTATIONS))
        if choice == "X":
            out.append(("X", (draw(st.sampled_from([None, *SESSIONS])),
                              draw(st.sampled_from([None, *SESSIONS])),
                              draw(st.sampled_from([None, 0, 1, 2, 3, 4])), draw(st.booleans())), mutation))
        else:
            out.append((choice, None, mutation))
    return out


@pytest.mark.slow
@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schedule=steps())
def test_search_speculated_trainings_mixed_with_stages_rounds_and_replays_keep_the_invariants(
        deployment, tmp_path_factory, schedule):
    """Invariants on every honest site after every step: (1) ``SiteJobs.run`` never raises; (2) each
    (kind, round) consumed at most once in ``site.db`` and each (purpose, round) given to at most
    one layer (never two sessions); (3) every update a layer takes for round k is the site's last
    training OF ROUND k; (4) trainings <= MAX_TRAININGS a round, late update setups <=
    MAX_LATE_SETUPS, contributions only for rounds 1..3; (5) a completed session sums exactly the
    inputs its participants' layers of that session took; (6) refusals are typed. After the
    schedule the pipelines are driven to their end honestly."""
    root = tmp_path_factory.mktemp("search11")
    ring = Ring(deployment, root, updates=2)
    original = SiteLayer._spend
    SiteLayer._spend = ring.spend_spy()  # type: ignore[method-assign]
    try:
        length = ring.parties[0].site.work.length
        sessions: dict[str, MaskedSession] = {
            "E1": ring.evaluation, "U2a": ring.updates[0], "U2b": ring.updates[1],
            "U3": layer(deployment, ring.config, 77).open(
                3, [ClientUpdate(c, np.zeros(length, np.float32), 1.0) for c in range(N)], purpose="update")}
        queues = {k: list(v) for k, v in PIPELINES.items()}
        last: dict[int, tuple[dict[str, Any], bytes]] = {}
        tail = [(k, None, "honest") for k in ("A", "B3", "B2") for _ in PIPELINES[k]]
        for choice, drawn, mutation in [*schedule, *tail]:
            if choice == "X":
                step = drawn
            elif queues[choice]:
                step = queues[choice].pop(0)
            else:
                continue
            _step(ring, sessions, step, mutation, last)
            _invariants(ring)
        outcomes = {name: ring.summed(session) for name, session in sessions.items() if session.done}  # (5)
        allowed = KNOWN | LATE | GATE | {NOT_PENDING}
        assert set(ring.refusals) <= allowed, set(ring.refusals) - allowed
        STATS.update(f"{name}:{'aborted' if o == 'aborted' else len(o)}" for name, o in outcomes.items())
    finally:
        SiteLayer._spend = original  # type: ignore[method-assign]
        ring.close()


STATS: Counter[str] = Counter()
"""How the searched sessions ended (read when tuning the search: it must complete sessions)."""


def _step(ring: Ring, sessions: dict[str, MaskedSession], step: tuple[Any, ...], mutation: str,
          last: dict[int, tuple[dict[str, Any], bytes]]) -> None:
    primary, second, train_round, evaluate = step
    if primary is not None and sessions[primary].done:
        primary = None
    if second is not None and (sessions[second].done or second == primary
                               or (primary is not None
                                   and sessions[second].purpose == sessions[primary].purpose)):
        second = None
    if primary is None and second is None:
        return
    p_out = sessions[primary].outgoing() if primary is not None else ("", {})
    s_out = sessions[second].outgoing() if second is not None else ("", {})
    replies: dict[str, dict[int, bytes]] = {"p": {}, "s": {}}
    for c in range(N):
        party = ring.parties[c]
        train = None
        if train_round is not None and second is not None:
            shifted = train_round
            if c == 0 and mutation == "shift":
                shifted = train_round + 1
            elif c == 0 and mutation == "late":
                shifted = train_round - 1
            if not (c == 0 and mutation == "untrained"):
                train = train_job(party, shifted)
        if c in p_out[1]:
            s = sessions[primary]  # type: ignore[index]
            first = evaluate_job(party, EVALUATED) if evaluate else None
            header, body = ring.job(c, s.purpose, s.round_index, p_out[0], p_out[1][c], first=first)
            if c in s_out[1]:
                label = "masked input" if (c == 0 and mutation == "relabel") else s_out[0]
                header, body = also_train(header, body, stage=label, message=s_out[1][c], train=train,
                                          purpose=sessions[second].purpose)  # type: ignore[index]
        elif c in s_out[1]:  # the second part alone: a layer job of its own, its training bundled
            s = sessions[second]  # type: ignore[index]
            header, body = ring.job(c, s.purpose, train[0]["round"] if train else s.round_index,
                                    s_out[0], s_out[1][c], first=train)
        else:
            continue
        if c == 0 and mutation == "replay" and 0 in last:
            header, body = last[0]
        if c == 0:
            last[0] = (header, body)
        answer, out = party.send(header, body)  # (1): raises nothing
        size = answer["also"]["size"] if isinstance(answer.get("also"), dict) else 0
        if answer["ok"] is True:
            replies["p" if c in p_out[1] else "s"][c] = out[:len(out) - size]
        else:
            ring.refusals.append(answer["reason"])
        if isinstance(answer.get("also"), dict):
            if answer["also"]["ok"] is True:
                replies["s"][c] = out[len(out) - size:]
            else:
                ring.refusals.append(answer["also"]["reason"])
    if primary is not None:
        sessions[primary].take(replies["p"])
    if second is not None:
        sessions[second].take(replies["s"])


def _invariants(ring: Ring) -> None:
    for c, party in enumerate(ring.parties):
        contributed, used = party.records()
        assert len(used) == len(set(used))
        given = [(i[2], i[3]) for i in ring.inputs if i[0] == c]
        assert len(given) == len(set(given)), given  # (2) never into two layers
        for i in ring.inputs:
            if i[0] == c and i[2] == "update":
                assert i[4].tobytes() == ring.trained_last[c].get(i[3]), \
                    ("an update of another training", i[3])
        assert all(n <= MAX_TRAININGS for n in _trainings(party).values())
        late = party.state._db.execute("SELECT count FROM late_update_setups").fetchall()
        assert all(n <= MAX_LATE_SETUPS for (n,) in late)
        assert set(contributed) <= {1, 2, 3}


# ---------------------------------------------------------------------------------------------
# Fuzzing the carried training's header (within 64-bit rounds: R11-1 is the round outside them)


@st.composite
def train_headers(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A ``train`` header for the second part: each field honest or garbage; and how its body is cut."""
    good = np.random.default_rng(5).bit_generator.state
    rounds = [NEXT, NEXT, NEXT, 1, 3, 0, -1, 2**62, -(2**63)]
    header: dict[str, Any] = {"kind": "train", "round": draw(st.sampled_from(rounds))}
    header["rng"] = draw(st.sampled_from([good, good, {"bit_generator": "PCG64"},
                                          {"bit_generator": "MT19937"},
                                          {**good, "state": {"state": -1, "inc": "x"}}, [], None, "PCG64"]))
    head = draw(st.sampled_from(["absent", None, {}, {"seq": 2**70, "hash": "0" * 64, "actor": "coordinator"},
                                 {"seq": True}, "head"]))
    if head != "absent":
        header["head"] = head
    model = draw(st.sampled_from(["absent", "a" * 64, "A" * 64, 5, None, ""]))
    if model != "absent":
        header["model"] = model
    for key in draw(st.lists(st.sampled_from(["noise", "noise_multiplier", "first", "also", "purpose"]),
                             max_size=2)):
        header[key] = draw(st.sampled_from([None, -1, 1.5, "x", {}, [1], 2**70]))
    body = draw(st.sampled_from(["model", "model", "empty", "short", "nan", "huge"]))
    return header, body


@pytest.mark.slow
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(carried=train_headers())
def test_search_a_carried_trainings_header_is_refused_typed_or_trained_never_raised(
        deployment, tmp_path_factory, carried):
    """Site 0 holds a late update layer of round 2 (its advertise keys answered); the coordinator
    sends the second part labelled as its masked input with a training whose header and body it
    made up. ``SiteJobs.run`` never raises; a refusal before training (malformed, gate, round,
    model) leaves ``site.db`` as it was; the primary part's answer is the same as without it."""
    from tests.fedsec.network.test_bundled_jobs import first_stage

    header, cut = carried
    party = Party(deployment, 0, tmp_path_factory.mktemp("fuzz11"))
    try:
        length = party.site.work.length
        message = first_stage(deployment, party.config, purpose="update", round_index=NEXT, length=length)[0]
        answer, _ = party.send({"kind": "layer", "round": NEXT, "stage": "advertise keys",
                                "purpose": "update"}, message)
        assert answer["ok"] is True
        vector = np.zeros(length, dtype=np.float32)
        if cut == "nan":
            vector[0] = np.nan
        if cut == "huge":
            vector[:] = 3e38
        body = {"empty": b"", "short": vector_bytes(vector)[:-4]}.get(cut, vector_bytes(vector))
        before = (party.records(), _trainings(party))
        primary = {"kind": "layer", "round": EVALUATED, "stage": "unmask", "purpose": "statistics"}
        plain, _ = party.send(primary, b"x")
        answer, out = party.send(*also_train(primary, b"x", stage="masked input", message=b"\x00" * 40,
                                             train=(header, body)))
        assert (answer["ok"], answer.get("reason")) == (plain["ok"], plain.get("reason"))
        report = answer["also"]
        assert report["ok"] is False  # the message is no masked input: never a reply
        if report["reason"] in ("MalformedEnvelope", TRAIN_NOT_FOR_LAYER, "rounds.invalid", "model.unknown"):
            assert (party.records(), _trainings(party)) == before, report
        assert party.records()[1] == []  # nothing consumed: the stage never took an input
    finally:
        party.close()
