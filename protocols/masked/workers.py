"""Worker processes for the server's unmask stage: the masks regenerated on more than one core.

``cryptography``'s X25519, HKDF, Ed25519 and AES-CTR calls hold the GIL (AES-CTR's ``update_into``
too: two threads expanding masks take as long as one), so the unmask stage's work (rebuilding the
secrets from shares, the key agreements, expanding every mask) only goes faster in more processes.

The unmask stage (:class:`protocols.masked.server.MaskedServer` with ``workers`` > 1) cuts its work
into jobs, one per secret it must rebuild (a survivor's self-mask seed; a dropped client's mask key
with the pairwise masks it shared with survivors), and shares them by a :class:`Schedule`: costliest
first, each worker process of a :class:`WorkerPool` holding up to :data:`IN_FLIGHT` chunks of a
shrinking size, the server taking one job at a time from the same list meanwhile. Each chunk comes
back as the raw bytes of its partial sum (a vector of uint32 or uint64 words, sign * mask added mod
2^word) or the first job of the chunk that failed (index and abort reason); the server adds the
partial sums into its own. Addition mod 2^word commutes, so the total is bit for bit the
single-process one; a failure is reported for the smallest failed job index, the abort the
single-process path raises first (every job is computed, by one side, whatever fails).

Before that, the same pool verifies the stages' Ed25519 signatures and hashes the unmask answers'
shares in batches while the server reads the later answers (:mod:`protocols.masked.deferred`).

What travels: the jobs go from the server to its own worker processes (the shares the server
took, already checked against their commitments, and public keys), and so do the signatures and
shares to check (values the server received), pickled by the server; what comes back is a
fixed-size byte string read with ``numpy.frombuffer`` (a partial sum; 32 bytes a share hash; one
byte a signature verdict) and a (job index, reason) pair, never an object a peer could shape. A
worker that dies, answers anything else, or does not answer within its deadline
(:data:`HUNG_AFTER_S`; its processes are then killed) raises :class:`WorkerError` (a
:class:`protocols.errors.ProtocolAbort`: the round releases nothing, never a partial sum) and the
broken pool is dropped, so the next round starts a fresh one.

Pools are shared: :func:`shared_pool` keeps one pool per size for the process's lifetime (its
workers are spawned once, then reused by every round), shut down at exit or by :func:`close_pools`.
Workers are started with the ``spawn`` method (safe beside threads, gRPC or Ray in the parent).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked.keys import mask_key, self_mask_key
from fedsec.secagg import keys as crypto
from fedsec.secagg import shamir
from fedsec.secagg.errors import CryptoError, SecAggError
from fedsec.secagg.prg import MaskExpander, word_dtype

MAX_WORKERS = 64
"""The largest ``workers`` value accepted (processes, the server's own included)."""
IN_FLIGHT = 2
"""Batches of work (signature checks, unmask jobs) each worker process holds at a time: one it
computes, one waiting, so that it never idles until the server's next hand-off."""
HUNG_AFTER_S = 30.0
"""A worker that has not answered a job this many seconds after the server waits for it is hung
(stopped, swapping, deadlocked: review S6-3): its pool is killed and the round aborts with
:class:`WorkerError`. For an unmask slice the wait is at least ``SLOW_FACTOR`` times what the
server's own slice took (slices are dealt at about equal cost), whichever is longer."""
SLOW_FACTOR = 20.0
"""How many times the server's own unmask slice time a worker's slice may take before it is hung."""
CHUNK_SHARE = 2.0
"""A worker's next chunk of unmask jobs is ``1 / (CHUNK_SHARE * workers)`` of the cost left."""


class WorkerError(ProtocolAbort):
    """A worker process of the server died or answered something other than what was asked (a
    partial sum, or one verdict per signature): the round aborts with nothing released."""


@dataclass(frozen=True)
class SeedJob:
    """Rebuild survivor ``owner``'s self-mask seed from ``shares`` (t x 33 bytes, the share at
    ``xs[i]`` at offset 33 i) and subtract its self-mask."""

    owner: int
    xs: tuple[int, ...]
    shares: bytes


@dataclass(frozen=True)
class KeyJob:
    """Rebuild dropped client ``owner``'s mask key from ``shares``, check it against its advertised
    ``public`` key, and remove each pairwise mask (partner id, partner's mask public key, sign)."""

    owner: int
    xs: tuple[int, ...]
    shares: bytes
    public: bytes
    partners: tuple[tuple[int, bytes, int], ...]


Job = SeedJob | KeyJob


def job_cost(job: Job) -> float:
    """Relative cost of a job in units of one mask expansion (for the :class:`Schedule`)."""
    if isinstance(job, SeedJob):
        return 1.3
    return 1.5 + 1.5 * len(job.partners)


class Schedule:
    """The order in which the server and its workers take the unmask jobs: the costliest first
    (a dropped client's pairwise masks before the seeds), the workers in chunks of a shrinking size
    (guided self-scheduling: a ``1 / (share * workers)`` part of the cost left, at least one job),
    the server one job at a time from the same list. Whoever is faster takes more; the last jobs
    are the cheapest, so the two sides end within about one seed expansion of each other.

    Args:
        jobs: the unmask jobs (only their costs are read).
        workers: processes taking jobs, the server's included, >= 1.
        share: the divisor of a worker's chunk, > 0 (larger: smaller chunks, more hand-offs);
            default :data:`CHUNK_SHARE`.
    """

    def __init__(self, jobs: Sequence[Job], *, workers: int, share: float | None = None) -> None:
        share = CHUNK_SHARE if share is None else share
        if not share > 0:
            raise ValueError(f"share must be > 0, got {share!r}")
        costs = [job_cost(job) for job in jobs]
        self._order = sorted(range(len(jobs)), key=lambda i: -costs[i])
        self._costs, self._next = costs, 0
        self._left = float(sum(costs))
        self._divisor = share * max(workers, 1)

    def __bool__(self) -> bool:
        return self._next < len(self._order)

    def take(self) -> int:
        """The next job's index (IndexError when none is left)."""
        index = self._order[self._next]
        self._next += 1
        self._left -= self._costs[index]
        return index

    def chunk(self) -> list[int]:
        """A worker's next chunk: job indices, ascending (empty when none is left)."""
        target, taken, out = self._left / self._divisor, 0.0, []
        while self and (not out or taken + self._costs[self._order[self._next]] <= target):
            index = self.take()
            out.append(index)
            taken += self._costs[index]
        return sorted(out)


def _secret(job: Job) -> bytes:
    size = shamir.SHARE_BYTES
    return shamir.combine_one(job.xs, [job.shares[i:i + size] for i in range(0, len(job.shares), size)])


class SliceRunner:
    """Runs unmask jobs into one accumulator (sign * mask added mod 2^word), remembering the
    failed job of smallest index (a failed job adds nothing)."""

    def __init__(self, session: bytes, round_index: int, length: int, modulus_bits: int,
                 expander: MaskExpander | None = None, acc: np.ndarray | None = None) -> None:
        self.session, self.round_index = session, round_index
        self.expander = expander or MaskExpander(length=length, modulus_bits=modulus_bits)
        self.acc = acc if acc is not None else np.zeros(length, dtype=word_dtype(modulus_bits))
        self.failure: tuple[int, str] | None = None

    def run(self, index: int, job: Job) -> None:
        """Rebuild the job's secret and add its masks into the accumulator; on failure keep (index,
        the abort reason) if it is the smallest index failed so far."""
        failure = self._failure(job)
        if failure is not None and (self.failure is None or index < self.failure[0]):
            self.failure = (index, failure)

    def _failure(self, job: Job) -> str | None:
        try:
            secret = _secret(job)
        except SecAggError:
            return f"unmask: the shares of client {job.owner}'s secret do not rebuild a 32-byte secret"
        if isinstance(job, SeedJob):
            self.expander.add_into(self_mask_key(secret, self.session, self.round_index, job.owner), self.acc,
                                   sign=-1)
            return None
        try:
            recovered = crypto.KeyPair.from_private(secret)
        except CryptoError:
            recovered = None
        if recovered is None or recovered.public != job.public:
            return f"unmask: shares of client {job.owner}'s mask key are inconsistent"
        for partner, public, sign in job.partners:
            self.expander.add_into(mask_key(recovered, public, self.session, self.round_index, partner,
                                            job.owner), self.acc, sign=sign)
        return None


_buffers: dict[tuple[int, int], tuple[MaskExpander, np.ndarray]] = {}
"""A worker process's expander and accumulator for each (length, modulus bits), reused by every
chunk it computes (a worker computes one chunk at a time): no fresh model-sized memory per chunk."""


def run_slice(session: bytes, round_index: int, length: int, modulus_bits: int,
              jobs: Sequence[tuple[int, Job]]) -> tuple[bytes, tuple[int, str] | None]:
    """Run ``(index, job)`` pairs (ascending indices) in a worker process: the partial sum's raw
    bytes (``length`` words of the modulus's word dtype) and None, or, at the first job that fails,
    empty bytes and (its index, the abort reason)."""
    expander, acc = _buffers.get((length, modulus_bits)) or (None, None)
    if expander is None or acc is None:
        expander = MaskExpander(length=length, modulus_bits=modulus_bits)
        acc = np.zeros(length, dtype=word_dtype(modulus_bits))
        _buffers.clear()  # one model size at a time
        _buffers[(length, modulus_bits)] = expander, acc
    else:
        acc.fill(0)
    runner = SliceRunner(session, round_index, length, modulus_bits, expander, acc)
    for index, job in jobs:
        runner.run(index, job)
        if runner.failure is not None:
            return b"", runner.failure
    return acc.tobytes(), None


def _ready() -> int:
    return os.getpid()


def check_workers(workers: object) -> int:
    """``workers`` validated: an integer in [1, MAX_WORKERS] (ValueError otherwise)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be an integer in [1, {MAX_WORKERS}], got {workers!r}")
    return workers


class WorkerPool:
    """``workers - 1`` worker processes (the server computes one slice itself), spawned on first use.

    Args:
        workers: processes computing the unmask stage, the server's own included, in [2, 64].
    """

    def __init__(self, *, workers: int) -> None:
        if check_workers(workers) < 2:
            raise ValueError(f"an WorkerPool needs workers >= 2, got {workers}")
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = ProcessPoolExecutor(
            max_workers=workers - 1, mp_context=multiprocessing.get_context("spawn"))
        self.broken = False

    def warm(self) -> list[int]:
        """Start every worker process now (each imports the code once) and return their pids.

        Raises:
            WorkerError: a worker could not start (e.g. a script without a ``__main__`` guard).
        """
        futures = [self._submit(_ready) for _ in range(self.workers - 1)]
        try:
            return sorted({f.result() for f in futures})
        except Exception as error:  # BrokenProcessPool
            self._fail()
            raise WorkerError(f"a worker process failed to start ({type(error).__name__})") from None

    def pids(self) -> list[int]:
        """The worker processes' ids (those started so far)."""
        executor = self._executor
        processes = getattr(executor, "_processes", None) or {}
        return sorted(processes)

    def _submit(self, fn, *args) -> Future:  # type: ignore[no-untyped-def]
        if self._executor is None or self.broken:
            raise WorkerError("the worker pool is closed or broken; nothing released")
        try:
            return self._executor.submit(fn, *args)
        except Exception as error:  # BrokenProcessPool or a shut-down executor
            self._fail()
            raise WorkerError(f"a worker process failed ({type(error).__name__}); nothing released") from None

    def _fail(self) -> None:
        self.broken = True
        _forget(self)
        for pid in self.pids():  # a hung worker would never end on its own (review S6-3)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.close()

    def partial_sum(self, jobs: Sequence[Job], *, session: bytes, round_index: int, length: int,
                    modulus_bits: int, profile: dict[str, float] | None = None) -> np.ndarray:
        """Sum of every job's masks (mod 2^word), computed here and in the workers: each worker
        holds up to :data:`IN_FLIGHT` chunks of a :class:`Schedule` while the server takes the
        schedule's jobs one at a time, handing a worker its next chunk whenever one comes back.
        Every job is computed once, by one side; the partial sums are added here.

        ``profile``, when given, receives ``own_slice`` (seconds the server computed jobs),
        ``wait`` (seconds it then waited for the workers' last chunks) and ``own_share`` (the part
        of the jobs' cost it computed itself, in [0, 1]).

        Raises:
            ProtocolAbort: the abort of the smallest-index job that failed (what the
                single-process path raises first).
            WorkerError: a worker died, answered something else or not at all within its
                deadline; its pool is closed.
        """
        if self._executor is None or self.broken:
            raise WorkerError("unmask: the worker pool is closed or broken; nothing released")
        dtype = word_dtype(modulus_bits)
        schedule = Schedule(jobs, workers=self.workers)
        runner = SliceRunner(session, round_index, length, modulus_bits)
        total = runner.acc  # the server's own jobs add here, and so do the workers' partial sums
        failures: list[tuple[int, str]] = []
        running: list[Future] = []
        broken: str | None = None
        own_cost = 0.0

        def send() -> None:
            part = schedule.chunk()
            running.append(self._submit(run_slice, session, round_index, length, modulus_bits,
                                        [(i, jobs[i]) for i in part]))

        def collect(future: Future, timeout: float) -> str | None:
            """Add a chunk's partial sum (or note its failure); why the worker is broken, or None."""
            try:
                answer = future.result(timeout=timeout)
            except TimeoutError:
                return f"no answer within {patience:.3g} s"
            except Exception as error:  # BrokenProcessPool, or anything the worker raised
                return type(error).__name__
            valid = (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], bytes))
            data, failed = answer if valid else (b"", None)
            if failed is not None and isinstance(failed, tuple) and len(failed) == 2:
                failures.append((int(failed[0]), str(failed[1])))
            elif len(data) != length * dtype.itemsize:
                return "a partial sum of the wrong size"
            else:
                np.add(total, np.frombuffer(data, dtype=dtype), out=total)
            return None

        patience = HUNG_AFTER_S
        try:
            while schedule and len(running) < IN_FLIGHT * (self.workers - 1):
                send()
        except WorkerError as error:
            raise WorkerError(f"unmask: {error}") from None
        started = time.perf_counter()
        while schedule and broken is None:
            for future in [f for f in running if f.done()]:
                running.remove(future)
                broken = broken or collect(future, 0.0)
                if schedule and broken is None:
                    try:
                        send()
                    except WorkerError:
                        broken = "the pool broke"
            if schedule and broken is None:
                index = schedule.take()
                runner.run(index, jobs[index])
                own_cost += job_cost(jobs[index])
        own_s = time.perf_counter() - started
        patience = max(HUNG_AFTER_S, SLOW_FACTOR * own_s)
        deadline = time.monotonic() + patience
        for future in running:
            broken = collect(future, max(deadline - time.monotonic(), 0.0)) if broken is None else broken
        if profile is not None:
            profile["own_slice"], profile["wait"] = own_s, time.perf_counter() - started - own_s
            profile["own_share"] = own_cost / max(sum(job_cost(job) for job in jobs), 1e-9)
        if broken is not None:
            self._fail()
            raise WorkerError(f"unmask: a worker process failed ({broken}); nothing released")
        if runner.failure is not None:
            failures.append(runner.failure)
        if failures:
            raise ProtocolAbort(min(failures)[1])
        return total

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            # A broken pool's manager thread fails its pending futures itself (cancelling them
            # first makes Python 3.11's raise InvalidStateError).
            executor.shutdown(wait=not self.broken, cancel_futures=not self.broken)


_pools: dict[int, WorkerPool] = {}
_pools_lock = threading.Lock()


def shared_pool(workers: int) -> WorkerPool:
    """The process-wide pool of this size, created on first use (a broken one is replaced)."""
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None or pool.broken:
            pool = _pools[workers] = WorkerPool(workers=workers)
        return pool


def _forget(pool: WorkerPool) -> None:
    with _pools_lock:
        if _pools.get(pool.workers) is pool:
            del _pools[pool.workers]


def close_pools() -> None:
    """Shut down every shared pool (each is started again on its next use)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


atexit.register(close_pools)
