"""Two masked sessions at once at a site (the barrier cut): the evaluation's sum is set up before its
sums exist and its first two stages travel in the update's calls; ``evaluate`` travels with its
masked input.

Adversary: the coordinator, with the other sites of the ring honest (they follow its schedule) or
not (a colluding site only adds messages the coordinator could send itself). It may route one
session's stage message to the other's layer, replay a stage into either, skip or relabel
stages, run the two sessions' stages in any interleaving (the evaluation's masked input before
the update's unmask), carry both in one call or apart, send the masked-input stage without an
``evaluate`` job, or send ``evaluate`` a model other than the one it aggregated. The sites are the
project's unmodified :class:`~fedsec.network.site.SiteJobs` on real sites (their ``SiteWork``,
``site.db`` and audit log; only the gRPC hop is left out), and the coordinator's sessions are the
project's :class:`~fedsec.network.layers.masking.MaskingCoordinator` / ``MaskedSession``.

Properties, for every schedule the search draws: (1) a session that completes sums exactly the
contributions the honest schedule sums for its participants (no key, mask or share of one session
ever enters the other: a mixed mask would leave noise of the size of the ring's modulus in the
sum), every other outcome is a typed abort (``ProtocolAbort`` at the coordinator, ``ClientAbort``
reasons at the sites); (2) every reply a site's layer sends carries the session id of the layer it
was sent to; (3) each site's update and evaluation are consumed at most once (``site.db``), and
each session's sum holds a site at most once.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.fl_core.federated_eval import local_evaluation
from fedsec.fl_core.parameters import set_vector
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from fedsec.protocols.masked.messages import SESSION_BYTES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.network import demo, pki
from fedsec.network.envelope import vector_bytes
from fedsec.network.layers import CoordinatorContext
from fedsec.network.layers.masking import MaskedSession, MaskingCoordinator, MaskingSite
from fedsec.network.site import SiteJobs
from tests.fedsec.network.test_bundled_jobs import Party, evaluate_job, train_job

N = 3
ROUND = 1
STAGES = MaskingSite.STAGES
OTHER = {"update": "statistics", "statistics": "update"}
NOT_PENDING = "the aggregation's setup names no pending contribution of this site"
UPDATE_SPENT = "this site's update of round 1 already went into an aggregation"
OUT_OF_ORDER = "a stage message this aggregation already answered, or out of order"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> demo.Deployment:
    return demo.prepare(tmp_path_factory.mktemp("two"), N, rounds=3, extra='[dp]\nmode = "none"\n')


def layer(d: demo.Deployment, config: Any, seed: int) -> MaskingCoordinator:
    """The project's coordinator layer (its exchange unused: the tests carry its messages)."""
    trust = pki.Trust.load(d.ca)
    peers = {s.name: pki.verify_peer(s.cert.read_bytes(), trust=trust, roles=("site",)) for s in d.sites}
    context = CoordinatorContext(config=config, rng=np.random.default_rng(seed),
                                 names=tuple(config.federation.sites),
                                 certificates={s.name: s.cert.read_bytes() for s in d.sites}, peers=peers,
                                 max_weight=1000, exchange=lambda stage, messages: {})
    return MaskingCoordinator(context)


def answered(party: Party, header: dict[str, Any], body: bytes, refusals: list[str]) -> dict[str, bytes]:
    """Send one ``layer`` job to ``party``: ``{purpose: reply}`` of the parts (the job's own, its
    ``also``) it answered; each refused part's reason is appended to ``refusals``."""
    answer, out = party.send(header, body)
    replies: dict[str, bytes] = {}
    second = answer.get("also")
    size = second["size"] if second else 0
    if answer["ok"] is True:
        replies[header["purpose"]] = out[:len(out) - size]
    else:
        refusals.append(answer["reason"])
    if second:
        if second["ok"] is True:
            replies[header["also"]["purpose"]] = out[len(out) - size:]
        else:
            refusals.append(second["reason"])
    return replies


class Ring:
    """N honest sites, trained for round 1 (unbundled, so each update is known), and the two
    sessions of round 1 opened by the project's coordinator layers."""

    def __init__(self, d: demo.Deployment, root: Path) -> None:
        self.parties = [Party(d, k, root / str(k)) for k in range(N)]
        self.config = self.parties[0].config
        work = self.parties[0].site.work
        self.updates: dict[int, tuple[np.ndarray, int]] = {}
        for c, p in enumerate(self.parties):
            answer, _ = p.send(*train_job(p, ROUND))
            assert answer["ok"] is True
            pending = p.site.work.pending
            self.updates[c] = (pending.vector.copy(), pending.weight)
        self.sums = {}
        for c, p in enumerate(self.parties):  # what `evaluate` of the zero model gives each site
            w = p.site.work
            set_vector(w.model, np.zeros(w.length, dtype=np.float32))
            self.sums[c] = local_evaluation(w.model, w.test_data, n_classes=w.n_classes)
        self.sessions: dict[str, MaskedSession] = {
            "update": layer(d, self.config, 1).open(
                ROUND, [ClientUpdate(c, np.zeros(work.length, np.float32), 1.0) for c in range(N)],
                purpose="update"),
            "statistics": layer(d, self.config, 2).open(
                ROUND, [ClientUpdate(c, np.zeros(work.evaluation_length, np.float32), 1.0) for c in range(N)],
                purpose="statistics")}
        self.refusals: list[str] = []
        self.foreign: list[tuple[str, bytes]] = []
        """(purpose, session id) of every reply a layer sent for another session: must stay empty."""

    def close(self) -> None:
        for p in self.parties:
            p.close()

    def job(self, c: int, purpose: str, label: str, message: bytes, *, evaluate: bool = False,
            also: tuple[str, str, bytes] | None = None) -> tuple[dict[str, Any], bytes]:
        """A ``layer`` job as the coordinator's hub builds it."""
        header: dict[str, Any] = {"kind": "layer", "round": ROUND, "stage": label, "purpose": purpose}
        body = message
        if evaluate:
            first, first_body = evaluate_job(self.parties[c], ROUND)
            header.update(first=first, first_size=len(first_body))
            body = first_body + body
        if also is not None:
            header["also"] = {"purpose": also[0], "stage": also[1], "size": len(also[2])}
            body = body + also[2]
        return header, body

    def check(self, purpose: str, reply: bytes) -> None:
        """Property (2): a reply carries the session id of the layer it is for."""
        session = reply[5:5 + SESSION_BYTES]
        if session != self.sessions[purpose].session:
            self.foreign.append((purpose, session))

    def answer(self, c: int, header: dict[str, Any], body: bytes) -> dict[str, bytes]:
        """Send one job to site ``c``: ``{purpose: reply}`` of the parts it answered."""
        replies = answered(self.parties[c], header, body, self.refusals)
        for purpose, reply in replies.items():
            if reply:
                self.check(purpose, reply)
        return replies

    def honest(self) -> dict[str, Any]:
        """The barrier cut's schedule: both sessions' first two stages in one call each, the update's
        last three, then evaluate with the evaluation's masked input and its last two."""
        upd, ev = self.sessions["update"], self.sessions["statistics"]
        calls = 0
        for _ in range(2):
            stage, out = upd.outgoing()
            second, extra = ev.outgoing()
            replies: dict[str, dict[int, bytes]] = {"update": {}, "statistics": {}}
            for c in range(N):
                got = self.answer(c, *self.job(c, "update", stage, out[c],
                                               also=("statistics", second, extra[c])))
                calls += 1
                for purpose, reply in got.items():
                    replies[purpose][c] = reply
            upd.take(replies["update"])
            ev.take(replies["statistics"])
        calls += self.drive(upd)
        calls += self.drive(ev, evaluate=True)
        return {"calls": calls}

    def drive(self, session: MaskedSession, *, evaluate: bool = False) -> int:
        calls = 0
        while not session.done:
            stage, out = session.outgoing()
            replies = {}
            for c, message in out.items():
                got = self.answer(c, *self.job(c, session.purpose, stage, message,
                                               evaluate=evaluate and stage == "masked input"))
                calls += 1
                if session.purpose in got:
                    replies[c] = got[session.purpose]
            session.take(replies)
        return calls

    def expected(self, purpose: str, participants: tuple[int, ...]) -> tuple[np.ndarray, float]:
        """What the honest schedule sums for ``participants``: (weighted sum, total weight)."""
        if purpose == "statistics":
            return sum(self.sums[c].astype(np.float64) for c in participants), float(len(participants))
        clip = self.config.secure.clip
        total = sum(w * np.clip(v.astype(np.float64), -clip, clip) for c in participants
                    for v, w in [self.updates[c]])
        return total, float(sum(self.updates[c][1] for c in participants))

    def outcome(self, purpose: str) -> Any:
        """Property (1): the session's sum is the honest one for its participants, or a typed abort."""
        try:
            result = self.sessions[purpose].result()
        except ProtocolAbort:
            return "aborted"
        assert len(set(result.participants)) == len(result.participants)  # a site at most once
        total, weight = self.expected(purpose, result.participants)
        assert result.total_weight == weight
        tolerance = 1e-2 if purpose == "statistics" else 1e-3 * weight
        assert np.allclose(result.weighted_sum, total, atol=tolerance)
        return result.participants

    def consumed(self) -> list[list[tuple[str, int]]]:
        return [p.records()[1] for p in self.parties]


def test_the_cut_schedule_sums_both_sessions_in_eight_exchanges(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        assert ring.honest() == {"calls": 8 * N}  # 5 + 5 stages in 8 calls a site
        assert ring.outcome("update") == (0, 1, 2)
        assert ring.outcome("statistics") == (0, 1, 2)
        assert ring.refusals == [] and ring.foreign == []
        assert ring.consumed() == [[("update", 1), ("evaluation", 1)]] * N
        assert all(p.jobs.layers == {} for p in ring.parties)  # both layers closed after their unmask
    finally:
        ring.close()


def first_two(ring: Ring) -> None:
    """Both sessions' advertise keys and share keys, honestly, in two calls a site."""
    upd, ev = ring.sessions["update"], ring.sessions["statistics"]
    for _ in range(2):
        stage, out = upd.outgoing()
        second, extra = ev.outgoing()
        replies: dict[str, dict[int, bytes]] = {"update": {}, "statistics": {}}
        for c in range(N):
            for purpose, reply in ring.answer(c, *ring.job(c, "update", stage, out[c],
                                                           also=("statistics", second, extra[c]))).items():
                replies[purpose][c] = reply
        upd.take(replies["update"])
        ev.take(replies["statistics"])


def test_a_message_routed_to_the_other_session_is_a_typed_abort_of_that_layer_only(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        first_two(ring)
        upd, ev = ring.sessions["update"], ring.sessions["statistics"]
        stage, out = upd.outgoing()  # the update's masked input, labelled for the evaluation's layer
        got = ring.answer(0, *ring.job(0, "statistics", stage, out[0]))
        assert got == {} and ring.refusals == ["message from another session or round"]
        assert set(ring.parties[0].jobs.layers) == {"update"}  # the evaluation's layer is gone
        # the update's layer is untouched: the same message, routed right, is answered
        replies = {c: ring.answer(c, *ring.job(c, "update", stage, out[c]))["update"] for c in range(N)}
        upd.take(replies)
        ring.drive(upd)
        assert ring.outcome("update") == (0, 1, 2)
        ring.drive(ev, evaluate=True)
        assert ring.outcome("statistics") in ((1, 2), "aborted")
        assert ("evaluation", 1) not in ring.consumed()[0]  # site 0's sums were never taken
        assert ring.foreign == []
    finally:
        ring.close()


def test_a_replayed_or_relabelled_stage_is_refused_before_the_contribution_is_taken(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        upd, ev = ring.sessions["update"], ring.sessions["statistics"]
        stage, out = upd.outgoing()
        second, extra = ev.outgoing()
        jobs = [ring.job(c, "update", stage, out[c], also=("statistics", second, extra[c])) for c in range(N)]
        replies: dict[str, dict[int, bytes]] = {"update": {}, "statistics": {}}
        for c in range(N):
            for purpose, reply in ring.answer(c, *jobs[c]).items():
                replies[purpose][c] = reply
        assert ring.refusals == []
        upd.take(replies["update"])
        ev.take(replies["statistics"])
        # site 1: the same call again: both setups are refused (its update is spent; this identity
        # took part in the evaluation's session)
        assert ring.answer(1, *jobs[1]) == {}
        assert ring.refusals == [UPDATE_SPENT, "this identity already took part in this session and round"]
        assert ring.parties[1].jobs.layers == {}
        ring.refusals.clear()
        # site 0: the evaluation's share-keys message labelled as its masked input, with an evaluate job
        _, shares = ev.outgoing()
        got = ring.answer(0, *ring.job(0, "statistics", "masked input", shares[0], evaluate=True))
        assert got == {} and ring.refusals == [OUT_OF_ORDER]
        assert ring.consumed()[0] == [("update", 1)]  # refused before its sums were taken
        assert set(ring.parties[0].jobs.layers) == {"update"}
        assert ring.foreign == []
    finally:
        ring.close()


def test_a_masked_input_without_an_evaluate_job_is_refused(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        first_two(ring)
        upd, ev = ring.sessions["update"], ring.sessions["statistics"]
        ring.drive(upd)
        stage, out = ev.outgoing()
        assert stage == "masked input"
        got = ring.answer(0, *ring.job(0, "statistics", stage, out[0]))  # no evaluate job
        assert got == {} and ring.refusals == [NOT_PENDING]
        assert "statistics" not in ring.parties[0].jobs.layers and ring.consumed()[0] == [("update", 1)]
    finally:
        ring.close()


def test_evaluate_of_another_model_is_summed_once_and_a_second_evaluate_is_refused(deployment, tmp_path):
    """No site can tell which model the coordinator aggregated (only the coordinator sees the sum):
    an ``evaluate`` of any model gives it the masked sums of that model, once a round."""
    ring = Ring(deployment, tmp_path)
    try:
        first_two(ring)
        upd, ev = ring.sessions["update"], ring.sessions["statistics"]
        stage, out = ev.outgoing()  # the evaluation's masked input before the update's (allowed)
        replies = {}
        for c in range(N):
            header, body = ring.job(c, "statistics", stage, out[c], evaluate=True)
            other = vector_bytes(np.full(ring.parties[c].site.work.length, 0.01, dtype=np.float32))
            body = other + body[header["first_size"]:]
            header["first_size"] = len(other)
            replies[c] = ring.answer(c, header, body)["statistics"]
        ev.take(replies)
        ring.drive(ev)
        ring.drive(upd)
        assert ring.outcome("update") == (0, 1, 2)
        result = ev.result()
        assert result.participants == (0, 1, 2) and result.total_weight == 3.0
        for p in ring.parties:  # a second evaluate of the round: refused, its sums are spent
            answer, _ = p.send(*evaluate_job(p, ROUND))
            assert (answer["ok"], answer["reason"]) == (False, "contribution.used")
        assert ring.consumed() == [[("update", 1), ("evaluation", 1)]] * N
    finally:
        ring.close()


def test_malformed_second_parts_are_refused_whole(deployment, tmp_path):
    ring = Ring(deployment, tmp_path)
    try:
        upd, ev = ring.sessions["update"], ring.sessions["statistics"]
        stage, out = upd.outgoing()
        second, extra = ev.outgoing()
        header, body = ring.job(0, "update", stage, out[0], also=("statistics", second, extra[0]))
        cases = [{**header, "also": {**header["also"], "purpose": "update"}},  # the same session twice
                 {**header, "also": {**header["also"], "size": len(body) + 1}},
                 {**header, "also": {**header["also"], "size": 0}},
                 {**header, "also": {**header["also"], "size": True}},
                 {**header, "also": {**header["also"], "extra": 1}},
                 {**header, "also": "statistics"},
                 {key: v for key, v in header.items() if key != "purpose"}]
        for bad in cases:
            answer, out_ = ring.parties[0].send(bad, body)
            assert (answer["ok"], answer["reason"], out_) == (False, "MalformedEnvelope", b"")
            assert "also" not in answer
        assert ring.parties[0].jobs.layers == {}
    finally:
        ring.close()


def test_a_late_update_setup_is_refused_once_the_update_is_spent_and_under_client_level_dp(
        deployment, tmp_path):
    """An update's session may be set up before its training (its keys agreed during the round
    before), but not once that round's update went into an aggregation, and never under
    client-level DP (each update's noise share is drawn for its own session)."""
    ring = Ring(deployment, tmp_path)
    try:
        stage, out = ring.sessions["update"].outgoing()
        party = ring.parties[0]
        assert ring.answer(0, *ring.job(0, "update", stage, out[0])).keys() == {"update"}
        assert ring.answer(0, *ring.job(0, "update", stage, out[0])) == {}  # consumed: no second setup
        assert ring.refusals == [UPDATE_SPENT]
        config = party.jobs.context.config
        client_level = dataclasses.replace(config, dp=dataclasses.replace(config.dp, mode="client"))
        context = dataclasses.replace(party.jobs.context, config=client_level)
        with pytest.raises(ClientAbort, match="setup"):
            MaskingSite(context, setup={"purpose": "update", "round": 1, "session": "00" * 16,
                                        "certificates": {}}, vector=None, weight=0, length=4)
    finally:
        ring.close()


@st.composite
def plays(draw: st.DrawFn) -> list[tuple[str, str, bool]]:
    """A schedule: which session steps next, what the coordinator does to site 0's message of it
    (nothing, route it to the other layer, replay it, relabel it, withhold its evaluate job), and
    whether the step carries the other session's next stage in the same calls."""
    steps = draw(st.lists(st.tuples(st.sampled_from(["update", "statistics"]),
                                    st.sampled_from(["honest", "honest", "swap", "replay", "relabel",
                                                     "no evaluate"]),
                                    st.booleans()), min_size=1, max_size=12))
    return steps


SEARCH = settings(max_examples=25, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.slow
@SEARCH
@given(schedule=plays())
def test_search_every_interleaving_sums_the_honest_sums_or_aborts_typed(deployment, tmp_path_factory,
                                                                         schedule):
    ring = Ring(deployment, tmp_path_factory.mktemp("search"))
    try:
        honest_steps = itertools.cycle([("update", "honest", False), ("statistics", "honest", False)])
        steps = itertools.chain(schedule, honest_steps)
        for which, move, paired in steps:
            sessions = ring.sessions
            if all(s.done for s in sessions.values()):
                break
            session = sessions[which]
            if session.done:
                continue
            rider = sessions[OTHER[which]]
            ride = paired and not rider.done
            stage, out = session.outgoing()
            second, extra = rider.outgoing() if ride else ("", {})
            replies: dict[str, dict[int, bytes]] = {"update": {}, "statistics": {}}
            for c in sorted(set(out) | set(extra)):
                target, label = which, stage
                if c == 0 and move == "swap":
                    target = OTHER[which]
                if c == 0 and move == "relabel":
                    label = STAGES[(STAGES.index(stage) + 1) % len(STAGES)]
                evaluate = (which == "statistics" and stage == "masked input"
                            and not (c == 0 and move == "no evaluate"))
                also = (OTHER[which], second, extra[c]) if ride and c in extra else None
                if c not in out:  # only the rider's message for this site
                    target, label, evaluate = OTHER[which], second, False
                    late = OTHER[which] == "statistics" and second == "masked input"
                    header, body = ring.job(c, target, label, extra[c], evaluate=late)
                else:
                    header, body = ring.job(c, target, label, out[c], evaluate=evaluate,
                                            also=None if target == also_target(also) else also)
                got = ring.answer(c, header, body)
                if c == 0 and move == "replay":  # the same job again: nothing more is answered
                    assert ring.answer(c, header, body) == {}
                # a reply only counts for the session whose message it answered
                for purpose, reply in got.items():
                    origin = which if purpose == target and c in out else OTHER[which]
                    if purpose == origin:
                        replies[purpose][c] = reply
            session.take(replies[which])
            if ride:
                rider.take(replies[OTHER[which]])
        assert ring.foreign == []
        for purpose in ("update", "statistics"):
            ring.outcome(purpose)
        for used in ring.consumed():  # each contribution consumed at most once
            assert len(used) == len(set(used))
        reasons = set(ring.refusals)
        assert reasons <= KNOWN, reasons - KNOWN
    finally:
        ring.close()


def also_target(also: tuple[str, str, bytes] | None) -> str | None:
    return None if also is None else also[0]


KNOWN = {
    "message from another session or round", "malformed message", "client has aborted",
    "a stage message this aggregation already answered, or out of order",
    "this aggregation is over at this site (finished or aborted); a stage needs a new setup",
    "a stage message without a setup", "the aggregation's setup names no pending contribution of this site",
    "the setup's purpose is not the one its stage message names",
    "this identity already took part in this session and round", "contribution.used",
    "the masked-input stage came before this client was given its input", "too few survivors",
    "fewer than t neighbours", "MalformedEnvelope", "a client that was never in the round",
    "survivor lists disagree", "itself listed as dropped", UPDATE_SPENT,
    "this site set up 3 sums of its update of round 1 before their input, the most it sets up",
}
"""Every typed refusal the search may meet (a new one fails the test: look at it)."""
assert SiteJobs.PURPOSES == ("update", "statistics")


def test_the_hub_packs_a_second_stage_into_each_call_and_splits_the_answers(deployment, tmp_path):
    """The coordinator's ``Hub.exchange(also=...)`` with the sites' unmodified job runner behind
    its mailboxes (the gRPC hop left out): a site with both parts gets one job, a site with only the
    second gets a job of its own, and a refused second part drops that site from that session only."""
    import threading

    from fedsec.secagg.keys import SigningKey

    from fedsec.network import envelope
    from fedsec.network.coordinator import Hub, SiteInfo
    from fedsec.network.party_audit import PartyAudit

    ring = Ring(deployment, tmp_path / "ring")
    (tmp_path / "hub").mkdir()
    audit = PartyAudit(tmp_path / "hub", actor="coordinator", key=SigningKey.generate(), run_id="ab" * 8)
    coordinator = deployment.coordinator
    hub = Hub(config=ring.config, plan_bytes=deployment.plan.read_bytes(),
              trust=pki.Trust.load(deployment.ca), cert_pem=coordinator.cert.read_bytes(),
              key_pem=coordinator.key.read_bytes(), audit=audit, listen="127.0.0.1:0")
    names = hub.names
    for k, name in enumerate(names):
        hub.sites[name] = SiteInfo(name, k, 1, 1, (1,), 2)
    calls = {name: 0 for name in names}
    result: dict[str, Any] = {}
    try:
        upd, ev = ring.sessions["update"], ring.sessions["statistics"]
        stage, out = upd.outgoing()
        second, extra = ev.outgoing()
        jobs = {names[c]: ({"stage": stage, "purpose": "update"}, out[c]) for c in (0, 1)}
        also = {names[c]: ({"purpose": "statistics", "stage": second}, extra[c]) for c in range(N)}
        also[names[1]] = ({"purpose": "statistics", "stage": second}, out[1])  # another session's message
        # the hub waits for the answers in a thread; the sites (whose site.db belongs to this
        # thread) work the jobs posted to their mailboxes here
        waiting = threading.Thread(target=lambda: result.update(
            answers=hub.exchange("layer", ROUND, jobs, 30.0, also=also)))
        waiting.start()
        while waiting.is_alive():
            for k, name in enumerate(names):
                job = hub.mailboxes.poll(name, 0.05)
                if job is None:
                    continue
                header, body = envelope.decode(job[1])
                calls[name] += 1
                answer, reply = ring.parties[k].jobs.run(job[0], header, body, header.get("round"))
                hub.mailboxes.answer(name, job[0], envelope.encode(answer, reply))
        waiting.join()
        answers = result["answers"]
        assert set(answers) == {names[0], names[1]} and set(hub.also_answers) == {names[0], names[2]}
        assert calls == {names[0]: 1, names[1]: 1, names[2]: 1}  # one call a site, whatever it carries
        for name, (header, body) in answers.items():
            assert header["ok"] is True
            ring.check("update", body)
        for body in hub.also_answers.values():
            ring.check("statistics", body)
        assert ring.foreign == []
        assert set(ring.parties[1].jobs.layers) == {"update"}  # its evaluation layer refused the message
        assert set(ring.parties[2].jobs.layers) == {"statistics"}
    finally:
        hub.mailboxes.close()
        audit.close()
        ring.close()
