"""The unmask stage's work shared between the server and its workers by a schedule (issue 16,
session 7): the same sum bit for bit, and the same first abort, as one process computing every job
in order.

Adversary: the clients whose secrets the jobs rebuild, any of whom may have dealt shares of a value
that is not its secret (above 2^256: no 32-byte secret; or a mask key that does not match the
advertised public key). A hypothesis search draws the jobs (seeds and dropped clients' mask keys,
each honest or lying), the chunk divisor and the batches a worker may hold, and compares
:meth:`WorkerPool.partial_sum` against a plain sequential computation written here from the
primitives (Shamir, the key derivations, the mask PRG): the same words, or the abort of the
smallest-index job that failed. Whatever the schedule hands to whom, no job is computed twice or
left out.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import deferred, workers
from fedsec.protocols.masked.keys import mask_key, self_mask_key, share_hash
from fedsec.protocols.masked.workers import KeyJob, Schedule, SeedJob, WorkerError, job_cost, shared_pool
from fedsec.secagg import keys as crypto
from fedsec.secagg import shamir
from fedsec.secagg.errors import CryptoError, SecAggError
from fedsec.secagg.prg import MaskExpander
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocols.helpers import make_session, stopped_worker
from tests.protocols.test_unmask_workers import _play, _replay

SESSION, ROUND, LENGTH, BITS, T = bytes(range(16)), 3, 7, 12, 3
KINDS = ("seed", "seed above 2^256", "key", "key above 2^256", "key inconsistent")


def _shares(value: int, rng: np.random.Generator) -> tuple[tuple[int, ...], bytes]:
    """t shares of ``value`` (any integer below the field prime) at distinct random x-coordinates."""
    xs = tuple(sorted(rng.choice(np.arange(1, 50), size=T, replace=False).tolist()))
    coefficients = [value] + [int.from_bytes(rng.bytes(32), "big") % shamir.PRIME for _ in range(T - 1)]
    points = [sum(c * x**i for i, c in enumerate(coefficients)) % shamir.PRIME for x in xs]
    return xs, b"".join(shamir.share_to_bytes(p) for p in points)


def _jobs(kinds: list[str], partners: list[int], seed: int):
    rng = np.random.default_rng(seed)
    peers = [crypto.KeyPair.from_private(rng.bytes(32)) for _ in range(4)]
    jobs = []
    for owner, (kind, count) in enumerate(zip(kinds, partners, strict=True), start=100):
        if kind.startswith("seed"):
            value = 2**256 + 5 if kind.endswith("2^256") else int.from_bytes(rng.bytes(32), "big")
            jobs.append(SeedJob(owner, *_shares(value, rng)))
            continue
        pair = crypto.KeyPair.from_private(rng.bytes(32))
        value = 2**256 + 9 if kind.endswith("2^256") else int.from_bytes(pair.private, "big")
        public = peers[0].public if kind.endswith("inconsistent") else pair.public
        chosen = tuple((p, peers[p].public, 1 if p % 2 else -1) for p in range(count))
        jobs.append(KeyJob(owner, *_shares(value, rng), public, chosen))
    return jobs


def _sequential(jobs) -> tuple[str, bytes]:
    """One process, every job in index order: ("done", the sum of sign * mask mod 2^b as uint32
    words) or ("aborted", the first reason)."""
    expander = MaskExpander(length=LENGTH, modulus_bits=BITS)
    total = [0] * LENGTH
    for job in jobs:
        try:
            secret = shamir.combine_one(job.xs, [job.shares[i:i + 33] for i in range(0, len(job.shares), 33)])
        except SecAggError:
            return ("aborted", f"unmask: the shares of client {job.owner}'s secret do not rebuild a "
                               "32-byte secret")
        if isinstance(job, SeedJob):
            terms = [(self_mask_key(secret, SESSION, ROUND, job.owner), -1)]
        else:
            try:
                pair = crypto.KeyPair.from_private(secret)
            except CryptoError:
                pair = None
            if pair is None or pair.public != job.public:
                return ("aborted", f"unmask: shares of client {job.owner}'s mask key are inconsistent")
            terms = [(mask_key(pair, public, SESSION, ROUND, p, job.owner), sign)
                     for p, public, sign in job.partners]
        for key, sign in terms:
            mask = expander.expand(key).tolist()
            total = [(a + sign * b) % 2**BITS for a, b in zip(total, mask, strict=True)]
    return ("done", np.array(total, dtype=np.uint32).tobytes())


@settings(max_examples=60, deadline=None)
@given(costs=st.lists(st.integers(0, 30), max_size=40), parts=st.integers(2, 6),
       share=st.sampled_from([0.5, 1.0, 2.0, 8.0]), taken=st.lists(st.booleans(), max_size=60))
def test_the_schedule_hands_out_every_job_once_costliest_first(costs, parts, share, taken):
    share_bytes = b"\x00" * shamir.SHARE_BYTES
    jobs = [SeedJob(i, (1,), share_bytes) if c == 0 else KeyJob(i, (1,), share_bytes, b"", ((1, b"", 1),) * c)
            for i, c in enumerate(costs)]
    schedule = Schedule(jobs, workers=parts, share=share)
    seen, order = [], []
    for chunked in taken:  # the server takes one job, or a worker a chunk, in any interleaving
        if not schedule:
            break
        if chunked:
            left = sum(job_cost(jobs[i]) for i in range(len(jobs)) if i not in seen)
            part = schedule.chunk()
            assert part and part == sorted(part)
            assert len(part) == 1 or sum(job_cost(jobs[i]) for i in part) <= left / (share * parts) + 1e-9
        else:
            part = [schedule.take()]
        seen += part
        order += sorted(part, key=lambda i: -job_cost(jobs[i]))
    while schedule:
        seen.append(schedule.take())
        order.append(seen[-1])
    assert sorted(seen) == list(range(len(jobs)))
    assert schedule.chunk() == []
    handed = [job_cost(jobs[i]) for i in order]
    assert handed == sorted(handed, reverse=True)  # the cheapest jobs come last: the two sides end together


def test_the_schedule_refuses_a_divisor_that_is_not_positive():
    with pytest.raises(ValueError, match="share"):
        Schedule([], workers=2, share=0.0)


@pytest.mark.slow  # starts a worker process (once per test session)
@settings(max_examples=25, deadline=None)
@given(kinds=st.lists(st.sampled_from(KINDS), max_size=14), partners=st.lists(st.integers(0, 4), min_size=14,
                                                                              max_size=14),
       seed=st.integers(0, 1000), share=st.sampled_from([0.5, 2.0, 8.0]), held=st.integers(1, 3),
       liars=st.booleans())
def test_the_shared_unmask_sum_equals_one_process_computing_every_job_in_order(
        kinds, partners, seed, share, held, liars):
    if not liars:
        kinds = [k for k in kinds if k in ("seed", "key")]
    jobs = _jobs(kinds, partners[:len(kinds)], seed)
    expected = _sequential(jobs)
    profile: dict[str, float] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workers, "CHUNK_SHARE", share)
        patch.setattr(workers, "IN_FLIGHT", held)
        try:
            total = shared_pool(2).partial_sum(jobs, session=SESSION, round_index=ROUND, length=LENGTH,
                                               modulus_bits=BITS, profile=profile)
        except ProtocolAbort as abort:
            assert expected == ("aborted", str(abort))
            return
    # The partial sums are mod 2^32 (the word); the server reduces mod 2^b once at the end.
    assert expected == ("done", (total & np.uint32(2**BITS - 1)).tobytes())
    assert 0.0 <= profile["own_share"] <= 1.0 + 1e-9


@pytest.mark.slow  # starts a worker process (once per test session)
@pytest.mark.parametrize("share, held", [(2.0, 2), (8.0, 1), (1.0, 3)])
def test_a_round_sized_mix_of_jobs_gives_the_sequential_sum(share, held):
    # Ten seeds and three dropped clients: the worker takes the costliest jobs first, the server
    # (between hand-offs) the rest, both sides computing part of the sum.
    jobs = _jobs(["seed"] * 10 + ["key"] * 3, [3, 4, 2] * 4 + [1], 7)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workers, "CHUNK_SHARE", share)
        patch.setattr(workers, "IN_FLIGHT", held)
        total = shared_pool(2).partial_sum(jobs, session=SESSION, round_index=ROUND, length=LENGTH,
                                           modulus_bits=BITS)
    assert _sequential(jobs) == ("done", (total & np.uint32(2**BITS - 1)).tobytes())


@pytest.mark.slow  # starts a worker process, stops it
def test_a_hung_worker_hashing_shares_is_a_typed_abort(monkeypatch):
    monkeypatch.setattr(workers, "HUNG_AFTER_S", 1.0)
    rows = (np.array([7], dtype=np.uint64), np.array([1]), np.array([0]), np.zeros((1, 33), dtype=np.uint8))
    with stopped_worker() as pool:
        hashes = deferred.DeferredHashes(pool, session=SESSION, round_index=ROUND, batch=1)
        hashes.add("answer", rows)
        with pytest.raises(WorkerError, match="no answer within"):
            hashes.finish()
        assert pool.broken and shared_pool(2) is not pool  # the next round gets a fresh pool


def test_share_hashes_computed_in_batches_equal_the_share_hash_of_each_share():
    rng = np.random.default_rng(4)
    answers = [(rng.integers(1, 2**40, n).astype(np.uint64), rng.integers(1, 100, n), rng.integers(0, 2, n),
                rng.integers(0, 256, (n, 33)).astype(np.uint8)) for n in (0, 1, 5, 96)]
    digests = deferred.hash_rows(SESSION, ROUND, answers)
    expected = b"".join(share_hash(SESSION, ROUND, int(o), int(x), int(k), s.tobytes())
                        for owners, xs, kinds, shares in answers
                        for o, x, k, s in zip(owners, xs, kinds, shares, strict=True))
    assert digests == expected and deferred.hash_rows(SESSION, ROUND, []) == b""


@pytest.mark.slow  # starts a worker process (once per test session)
def test_a_pooled_server_restores_the_switch_interval_after_each_call_and_an_abort():
    s = make_session(9, length=30, graph="harary", seed=5)
    stages = _play(s, {sorted(s.clients)[2]: "drop 2", sorted(s.clients)[4]: "wrong mask key"})
    assert s.server.abort_reason is not None  # the reconstruction aborts at the unmask stage
    before = sys.getswitchinterval()
    ending, _, _, _ = _replay(s, stages, workers=2)
    assert ending == ("aborted", s.server.abort_reason)
    assert sys.getswitchinterval() == before
