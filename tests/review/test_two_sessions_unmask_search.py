"""Review 8b, item 1: a coordinator with one colluding site searches per-session survivor lists and
forged unmask requests over the barrier cut's two masked sessions (update and evaluation of one
round, first two stages carried in the same calls) against the project's UNMODIFIED site code
(:class:`~fedsec.network.site.SiteJobs` on real sites, ``site.db``; only the gRPC hop left out).

Adversary: the coordinator and site 3 (c = 1 at n = 5, ``secure.corrupt = 0.2``: degree 4,
threshold 3). Both sessions run honestly through their masked inputs (each honest site's update
and evaluation sums are then in the coordinator's hands, masked). Then, in each session
independently, the adversary sends every honest site a survivor list of its choice (a different
one to each), collects the signatures, and sends each honest site an unmask request with
alive / dropped lists of its choice, the signatures of any one signed list (the colluder signs
anything) and the attestations it holds. It keeps every share revealed, and the colluder's own
shares.

Property (algebraic): for every honest site u and session X in which u's masked input was sent,
the adversary cannot strip both u's self mask (>= t shares of u's seed of X) and every pairwise
mask of u in X (for each partner v: >= t shares of u's or v's mask key of X, or v the colluder).
The two sessions' keys are independent (no public key, and so no secret, appears in both), so
nothing revealed in one session enters the other's masks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.keys import consistency_message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.network import demo
from tests.fedsec.network.test_bundled_jobs import Party, evaluate_job, train_job
from tests.fedsec.network.test_two_sessions import layer

N = 5
COLLUDER = 4
HONEST = (0, 1, 2, 3)
ROUND = 1
PURPOSES = ("update", "statistics")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> demo.Deployment:
    return demo.prepare(tmp_path_factory.mktemp("r8b"), N, rounds=3,
                        extra='[dp]\nmode = "none"\n[secure]\ncorrupt = 0.2\n')


def job(purpose: str, stage: str, message: bytes, *, first: tuple[dict[str, Any], bytes] | None = None,
        also: tuple[str, str, bytes] | None = None) -> tuple[dict[str, Any], bytes]:
    header: dict[str, Any] = {"kind": "layer", "round": ROUND, "stage": stage, "purpose": purpose}
    body = message
    if first is not None:
        header.update(first=first[0], first_size=len(first[1]))
        body = first[1] + body
    if also is not None:
        header["also"] = {"purpose": also[0], "stage": also[1], "size": len(also[2])}
        body = body + also[2]
    return header, body


def split(answer: dict[str, Any], out: bytes, purpose: str, other: str | None) -> dict[str, bytes]:
    second = answer.get("also")
    size = second["size"] if second else 0
    got = {}
    if answer["ok"] is True:
        got[purpose] = out[:len(out) - size]
    if second and second["ok"] is True and other is not None:
        got[other] = out[len(out) - size:]
    return got


class Run:
    """Five honest site codes, round 1 trained; both sessions driven honestly to their masked inputs."""

    def __init__(self, d: demo.Deployment, root: Path) -> None:
        self.parties = [Party(d, k, root / str(k)) for k in range(N)]
        config = self.parties[0].config
        for p in self.parties:
            answer, _ = p.send(*train_job(p, ROUND))
            assert answer["ok"] is True
        work = self.parties[0].site.work
        self.sessions = {
            "update": layer(d, config, 1).open(
                ROUND, [ClientUpdate(c, np.zeros(work.length, np.float32), 1.0) for c in range(N)],
                purpose="update"),
            "statistics": layer(d, config, 2).open(
                ROUND, [ClientUpdate(c, np.zeros(work.evaluation_length, np.float32), 1.0) for c in range(N)],
                purpose="statistics")}
        self.keys: dict[str, dict[int, tuple[bytes, bytes]]] = {}
        self.refusals: list[tuple[str, str, int, str]] = []
        self.digest: dict[str, bytes] = {}
        self.masked: dict[str, dict[int, m.MaskedInput]] = {p: {} for p in PURPOSES}
        self.held: dict[str, dict[int, tuple[int, int]]] = {}
        """Per session, the colluder's own (seed share, mask-key share) of each partner."""
        upd, ev = self.sessions["update"], self.sessions["statistics"]
        for _ in range(2):  # the cut: both sessions' first two stages in the same calls
            stage, out = upd.outgoing()
            second, extra = ev.outgoing()
            replies: dict[str, dict[int, bytes]] = {"update": {}, "statistics": {}}
            for c in range(N):
                got = split(*self.parties[c].send(*job("update", stage, out[c],
                                                       also=("statistics", second, extra[c]))),
                            "update", "statistics")
                for purpose, reply in got.items():
                    replies[purpose][c] = reply
            assert {k: len(v) for k, v in replies.items()} == {"update": N, "statistics": N}
            upd.take(replies["update"])
            ev.take(replies["statistics"])
        for purpose in PURPOSES:  # what the key lists told every site
            client = self.parties[0].jobs.layers[purpose].client._ctx
            self.keys[purpose] = {v: (e.encryption_key, e.mask_key) for v, e in client.neighbour_keys.items()}
            own = self.parties[0].jobs.layers[purpose].client._ctx
            self.keys[purpose][0] = (own.encryption.public, own.masking.public)
        for purpose in PURPOSES:  # the masked inputs (the evaluation's with its evaluate job)
            session = self.sessions[purpose]
            stage, out = session.outgoing()
            assert stage == "masked input"
            replies = {}
            for c in range(N):
                first = evaluate_job(self.parties[c], ROUND) if purpose == "statistics" else None
                got = split(*self.parties[c].send(*job(purpose, stage, out[c], first=first)), purpose, None)
                replies[c] = got[purpose]
                _, body = m.decode(got[purpose], expect=m.MaskedInput)
                self.masked[purpose][c] = body
            session.take(replies)
            colluder = self.parties[COLLUDER].jobs.layers[purpose].client._ctx
            self.held[purpose] = {v: (s, k) for v, (s, k) in colluder.received.items()}
            self.digest[purpose] = colluder.digest
        self.threshold = self.parties[0].jobs.layers["update"].client._ctx.threshold
        self.quorum = self.parties[0].jobs.layers["update"].client._ctx.quorum

    def close(self) -> None:
        for p in self.parties:
            p.close()

    def header(self, purpose: str, kind: int, recipient: int) -> m.Header:
        return m.Header(kind, self.sessions[purpose].session, ROUND, m.SERVER, recipient)

    def ask(self, c: int, purpose: str, stage: str, body: Any) -> bytes | None:
        message = m.encode(self.header(purpose, body.KIND, c), body)
        answer, out = self.parties[c].send(*job(purpose, stage, message))
        if answer["ok"] is not True:
            self.refusals.append((purpose, stage, c, answer["reason"]))
        return split(answer, out, purpose, None).get(purpose)


FULL = frozenset(range(N))
subsets = st.one_of(st.just(FULL), st.sampled_from([FULL - {v} for v in range(N)]),
                    st.frozensets(st.sampled_from(range(N))))
"""Survivor lists the honest sites might sign (the full ring, the ring less one) and any other."""
small = st.one_of(st.just(frozenset()), st.frozensets(st.sampled_from(range(N)), max_size=2))


@st.composite
def attacks(draw: st.DrawFn) -> dict[str, Any]:
    plan: dict[str, Any] = {}
    for purpose in PURPOSES:
        lists = {r: draw(subsets) | {r} for r in HONEST}
        requests = {}
        for r in HONEST:
            alive = draw(subsets)
            dropped = draw(small) - alive - {r}
            requests[r] = (alive | {r}, dropped, draw(st.integers(0, 3)))
        plan[purpose] = (lists, requests)
    return plan


SEARCH = settings(max_examples=20, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def play(run: Run, purpose: str, lists: dict[int, frozenset[int]],
         requests: dict[int, tuple[frozenset[int], frozenset[int], Any]]) -> dict[int, list[tuple[int, int]]]:
    """One session's consistency and unmask stages as the adversary plays them: every share revealed."""
    colluder_key = run.parties[COLLUDER].jobs.context.identity
    session = run.sessions[purpose].session
    signed: dict[frozenset[int], dict[int, bytes]] = {}
    for r in HONEST:
        reply = run.ask(r, purpose, "consistency check", m.ConsistencyRequest(tuple(sorted(lists[r]))))
        if reply is not None:
            _, body = m.decode(reply, expect=m.ConsistencySignature)
            signed.setdefault(lists[r], {})[r] = body.signature
    for s in list(signed) + [frozenset(range(N))]:
        signed.setdefault(s, {})[COLLUDER] = colluder_key.sign(
            consistency_message(session, ROUND, tuple(sorted(s)), params=run.digest[purpose]))
    choices = sorted(signed, key=lambda s: (len(s), sorted(s)))
    revealed: dict[int, list[tuple[int, int]]] = {}
    for r in HONEST:
        alive, dropped, pick = requests[r]
        s = pick if isinstance(pick, frozenset) and pick in signed else choices[int(pick) % len(choices)]
        signatures = tuple(sorted(signed[s].items()))
        signers = set(signed[s])
        attest = []
        for owner in sorted(alive - {r} - signers):
            if owner == COLLUDER:
                continue
            mi = run.masked[purpose][owner]
            attest.append((owner, mi.partners, mi.signature))
        request = m.UnmaskRequest(tuple(sorted(alive)), tuple(sorted(dropped)), signatures, tuple(attest))
        reply = run.ask(r, purpose, "unmask", request)
        if reply is not None:
            _, body = m.decode(reply, expect=m.UnmaskResponse)
            revealed[r] = [(owner, which) for owner, which, _ in body.shares]
    return revealed


def exposed(run: Run, purpose: str, revealed: dict[int, list[tuple[int, int]]]) -> list[int]:
    """The honest sites whose input of this session the adversary can strip of every mask."""
    t = run.threshold
    count = {(u, which): 0 for u in range(N) for which in (m.SHARE_OF_SEED, m.SHARE_OF_MASK_KEY)}
    for v in run.held[purpose]:  # the colluder's own shares
        count[(v, m.SHARE_OF_SEED)] += 1
        count[(v, m.SHARE_OF_MASK_KEY)] += 1
    for shares in revealed.values():
        for owner, which in shares:
            count[(owner, which)] += 1
    knows = {key for key, k in count.items() if k >= t}
    out = []
    for u in HONEST:
        if (u, m.SHARE_OF_SEED) not in knows:
            continue
        partners = [v for v in range(N) if v != u]
        if all(v == COLLUDER or (u, m.SHARE_OF_MASK_KEY) in knows or (v, m.SHARE_OF_MASK_KEY) in knows
               for v in partners):
            out.append(u)
    return out


@SEARCH
@given(plan=attacks())
def test_search_no_honest_input_is_unmasked_in_either_session(deployment, tmp_path_factory, plan):
    run = Run(deployment, tmp_path_factory.mktemp("run"))
    try:
        assert (run.threshold, N - 1) == (3, 4)
        upd, ev = run.keys["update"], run.keys["statistics"]
        shared = {k for pair in upd.values() for k in pair} & {k for pair in ev.values() for k in pair}
        assert shared == set()  # independent keys: one session's secrets say nothing of the other's
        for purpose in PURPOSES:
            revealed = play(run, purpose, *plan[purpose])
            assert exposed(run, purpose, revealed) == [], (purpose, plan[purpose], revealed)
    finally:
        run.close()


def test_the_honest_unmask_reveals_the_seeds_the_adversary_counts(deployment, tmp_path):
    """Not vacuous: the adversary's machinery (its messages, the colluder's signatures, the share
    count) gets every honest site's seed shares when it plays honestly, and no input is exposed."""
    run = Run(deployment, tmp_path)
    try:
        for purpose in PURPOSES:
            honest = {r: (FULL, frozenset(), FULL) for r in HONEST}
            revealed = play(run, purpose, {r: FULL for r in HONEST}, honest)
            assert run.refusals == []
            assert {r: sorted(revealed[r]) for r in revealed} == {
                r: [(v, m.SHARE_OF_SEED) for v in range(N) if v != r] for r in HONEST}
            assert exposed(run, purpose, revealed) == []
    finally:
        run.close()


def test_the_classic_split_view_attack_is_refused_in_both_sessions(deployment, tmp_path):
    """Bonawitz's attack, per session and crossed between them: site 0 is 'alive' for some honest
    sites and 'dropped' for others (so their seed and mask-key shares both come out), with site 0
    told opposite things in the update and the evaluation session."""
    run = Run(deployment, tmp_path)
    try:
        full = frozenset(range(N))
        without = full - {0}
        for purpose, (first, second) in zip(PURPOSES, [(full, without), (without, full)], strict=True):
            lists = {0: full, 1: first, 2: second, 3: second}
            requests = {r: (lists[r] | {r}, full - lists[r] - {r}, lists[r]) for r in HONEST}
            revealed = play(run, purpose, lists, requests)
            assert exposed(run, purpose, revealed) == []
            # site 0's mask key never comes out next to its seed: the list dropping it has no quorum
            assert not any((0, m.SHARE_OF_MASK_KEY) in shares for shares in revealed.values())
        assert {reason for *_, reason in run.refusals} == {"too few survivors"}
    finally:
        run.close()

