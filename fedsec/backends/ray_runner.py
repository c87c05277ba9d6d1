"""The Ray backend: the clients' local training and masking stages on Ray actors.

What runs where:

- the driver (this process) keeps the server loop, the aggregation protocol's server side, the
  accountant, the audit log and the history; it samples the clients and draws their seeds;
- a pool of :class:`Worker` actors (one per ``cpus_per_client`` CPUs of the cluster) runs each
  sampled client's local update (``Strategy.client_update``, DP-SGD included) and hosts the
  masking clients of a round (:class:`~protocols.masked.client.MaskedClient`: key agreement,
  Shamir sharing, the pairwise-mask expansion, unmasking answers).

Each client's data goes to the object store once, when the run starts (``ray.put``), and from
there to a worker once: each worker keeps the data of the clients it has trained. A round puts
the global vector in the object store once (``ray.put``); it travels with each worker's first
task of the round only, and the sampled clients go in runs of consecutive clients, one task each.

Equal to the local backend (same seed, ``dp.reproducible = true``): the seeds of every client come
from the driver's generator in the same order; the DP-SGD noise stream is one AES-CTR stream in
the local backend, consumed client after client, so each task gets the stream positioned where the
local backend would be when that client starts (the driver predicts each client's draw from its
data size and the model's size, checks it against what the worker actually drew, and re-runs from
the first client whose position was wrong, so a wrong prediction costs time, never a reused or
different stream). Without ``dp.reproducible`` every task draws from a fresh OS-seeded stream.

Failures: a worker that dies (killed, out of memory, its machine lost) loses the clients it held;
they drop out (training: no update, counted in ``failed_clients``; masking: no more answers this
round, which the protocol recovers from like any dropout, counted in ``lost_clients``); a fresh
worker replaces it for the next task.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import ray
import torch
from torch import nn

from fedsec.backends.session import BackendError, connect
from fedsec.dp.noise import SecureRandom
from fedsec.fl_core.aggregation import AggregationProtocol
from fedsec.fl_core.client import LocalResult, Strategy
from fedsec.fl_core.data import FederatedDataset
from fedsec.fl_core.errors import NonFiniteError
from fedsec.fl_core.execution import ClientFailure, ClientRunner, ClientTask, Outcome
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked.aggregation import MaskedAggregation
from fedsec.protocols.masked.client import MaskedClient
from fedsec.protocols.masked.simulation import ClientCalls, ClientExecutor, ClientSpec, Handled
from fedsec.protocols.privacy.trainer import DPSGDTrainer

LOST_ERRORS = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
               ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError)
"""What a task raises when its worker died or could not be reached: its clients drop out."""


DEPTH = 2
"""Training tasks queued on one worker at once: the next is already there when one ends (a worker
that dies loses the clients of at most this many tasks).

Each training task takes 1 / (depth x workers) of the round's clients not yet sent (at least one):
a run of consecutive clients, large first and single clients at the end (guided self-scheduling,
counting the tasks each worker has out at once). Ray's cost per task (a worker's and the driver's
CPU, a wake-up of each) is paid about 14 times a round of 50 clients on 2 workers; the session-6
split, 1 / (4 x workers), paid it about 25 times. The last tasks are single clients either way, so
the workers still finish together (the schedule simulated with equal clients: 25 / 25 clients,
the last worker done within 3 ms of the first; with one worker 20% slower: 28 / 22)."""


def _drop_stream(random: SecureRandom) -> None:
    """A SecureRandom never travels: shipping one would let two workers draw the same noise."""
    return None


def _fresh_stream(_: None) -> SecureRandom:
    return SecureRandom()


def find_dpsgd(strategy: Any) -> DPSGDTrainer | None:
    """The DP-SGD trainer inside ``strategy`` (through ``inner`` and ``trainer``), or None."""
    node = strategy
    for _ in range(16):
        if isinstance(node, DPSGDTrainer):
            return node
        node = getattr(node, "trainer", None) or getattr(node, "inner", None)
        if node is None:
            return None
    return None


def find_masking(protocol: Any) -> MaskedAggregation | None:
    """The masking layer inside ``protocol`` (through the wrappers' ``inner``), or None."""
    node = protocol
    for _ in range(16):
        if isinstance(node, MaskedAggregation):
            return node
        node = getattr(node, "inner", None)
        if node is None:
            return None
    return None


def stream_bytes(trainer: DPSGDTrainer, n: int, n_parameters: int) -> int:
    """Bytes of the noise stream one DP-SGD call on ``n`` examples draws for a model with
    ``n_parameters`` trainable values: a uniform word per example and step (Poisson sampling) and,
    with noise, two uniform words per pair of Gaussians. A prediction: the runner checks it."""
    optimizer = trainer.optimizer
    steps = optimizer.steps(n)
    noisy = optimizer.noise_multiplier * optimizer.max_grad_norm > 0
    return 8 * steps * n + (16 * ((steps * n_parameters + 1) // 2) if noisy else 0)


class MissingInput(RuntimeError):
    """A training task reached a worker that lacks the round vector or a client's data: the task
    that carried them failed before it ran (its data could not be fetched)."""


class Worker:
    """One Ray actor: trains clients and hosts masking clients, one call at a time."""

    def __init__(self) -> None:
        torch.set_num_threads(1)  # the bundled models are tiny: one thread per worker is fastest
        self.model: nn.Module | None = None
        self.strategy: Strategy | None = None
        self.trainer: DPSGDTrainer | None = None
        self.rounds: dict[int, dict[int, MaskedClient]] = {}
        self.data: dict[int, Any] = {}
        """The training data of every client this worker has trained, by client id: each arrives
        once (zero-copy views of the object store), not with every task."""
        self.vector: np.ndarray | None = None
        """The global vector of the round being trained: sent with this worker's first task of
        the round only."""
        self.vector_round = -1
        """The runner's round number of ``vector``."""
        self.calls = 0
        """Training and masking calls answered so far."""
        self.busy = 0.0
        """CPU seconds this process's calling thread spent inside those calls (the clients' own
        work); the rest of the process's CPU is Ray's (receiving, (de)serialising, its threads)."""

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> tuple[int, float, float]:
        """(calls answered, CPU seconds inside them, CPU seconds of this whole process so far)."""
        return self.calls, self.busy, time.process_time()

    def _count(self, started: float) -> None:
        self.calls += 1
        self.busy += time.thread_time() - started

    def configure(self, model: nn.Module, strategy: Strategy) -> None:
        self.model, self.strategy = model, strategy
        self.trainer = find_dpsgd(strategy)

    def update_many(self, round_number: int, vector: np.ndarray | None, clients: Sequence[int],
                    seeds: Sequence[int], streams: Sequence[tuple[str, int] | None], fresh: Sequence[int],
                    *data: Any
                    ) -> list[tuple[LocalResult | None, list[tuple[float, float, int]], int | None]]:
        """:meth:`update` for consecutive ``clients``, one after another in this process, each from
        the global vector of the runner's round ``round_number``: ``vector`` when given (this
        worker's first task of a round; kept for the next ones), else the one kept, which must be
        that round's (never an older one). ``data`` are the training sets of the clients ``fresh``
        (those this worker has not held before: Ray resolves them from the object store before the
        call), kept for later rounds."""
        started = time.thread_time()
        try:
            return self._update_many(round_number, vector, clients, seeds, streams, fresh, data)
        finally:
            self._count(started)

    def _update_many(self, round_number: int, vector: np.ndarray | None, clients: Sequence[int],
                     seeds: Sequence[int], streams: Sequence[tuple[str, int] | None], fresh: Sequence[int],
                     data: Sequence[Any]
                     ) -> list[tuple[LocalResult | None, list[tuple[float, float, int]], int | None]]:
        if vector is not None:
            self.vector, self.vector_round = vector, round_number
        self.data.update(zip(fresh, data, strict=True))
        if (self.vector is None or self.vector_round != round_number
                or any(client not in self.data for client in clients)):
            raise MissingInput("this round's vector or a client's data never reached this worker")
        return [self.update(self.vector, self.data[client], seed, stream)
                for client, seed, stream in zip(clients, seeds, streams, strict=True)]

    def update(self, vector: np.ndarray, data: Any, seed: int, stream: tuple[str, int] | None
               ) -> tuple[LocalResult | None, list[tuple[float, float, int]], int | None]:
        """One client's local update from ``vector``; ``stream`` positions the DP-SGD noise stream
        (key hex, byte offset), None = a fresh OS-seeded one. Returns the result (None: not
        finite), the trainer's reports and where the stream ended (None without a stream)."""
        assert self.model is not None and self.strategy is not None
        if self.trainer is not None:
            random = SecureRandom()
            if stream is not None:
                random.load_state_dict({"key": stream[0], "offset": stream[1]})
            self.trainer.optimizer.random = random
        try:
            local = self.strategy.client_update(self.model, vector, data, rng=np.random.default_rng(seed))
        except NonFiniteError:
            local = None
        if self.trainer is None:
            return local, [], None
        end = int(self.trainer.optimizer.random.state_dict()["offset"]) if stream is not None else None
        return local, self.trainer.take_reports(), end

    def host(self, key: int, specs: Mapping[int, ClientSpec]) -> None:
        self.rounds[key] = {c: spec.build() for c, spec in specs.items()}

    def handle(self, key: int, messages: Sequence[tuple[int, bytes]],
               specs: Mapping[int, ClientSpec] | None = None) -> list[tuple[int, Handled]]:
        """Each hosted client's answer to its message; ``specs`` (the round's first call) builds
        this worker's clients of round ``key`` first."""
        started = time.thread_time()
        try:
            return self._handle(key, messages, specs)
        finally:
            self._count(started)

    def _handle(self, key: int, messages: Sequence[tuple[int, bytes]],
                specs: Mapping[int, ClientSpec] | None) -> list[tuple[int, Handled]]:
        if specs is not None:
            self.host(key, specs)
        clients, answers = self.rounds[key], []
        for client_id, message in messages:
            start = time.perf_counter()
            try:
                reply = clients[client_id].handle(message)
            except ClientAbort as abort:
                answers.append((client_id, Handled(abort=abort.reason, seconds=time.perf_counter() - start)))
                continue
            answers.append((client_id, Handled(reply=reply, seconds=time.perf_counter() - start)))
        return answers

    def release(self, key: int) -> None:
        self.rounds.pop(key, None)


class WorkerPool:
    """The workers of one run, created on first use.

    Args:
        cpus_per_worker: CPUs each worker reserves, > 0.
        workers: how many; 0 = as many as the cluster's CPUs allow (at least 1).
    """

    def __init__(self, *, cpus_per_worker: float = 1.0, workers: int = 0) -> None:
        if not cpus_per_worker > 0 or workers < 0:
            raise ValueError(f"cpus_per_worker must be > 0 and workers >= 0, got {cpus_per_worker}, "
                             f"{workers}")
        self.cpus_per_worker, self.workers = float(cpus_per_worker), workers
        self._actors: list[Any] = []
        self._setup: tuple[Any, Any] | None = None
        options = {"num_cpus": self.cpus_per_worker, "max_restarts": 0, "max_task_retries": 0}
        try:  # no task events: Ray's dashboard bookkeeping of every call, nobody reads it here
            self._cls = ray.remote(**options, enable_task_events=False)(Worker)
        except ValueError:  # a Ray before 2.12 has no such option
            self._cls = ray.remote(**options)(Worker)
        ray.util.register_serializer(SecureRandom, serializer=_drop_stream, deserializer=_fresh_stream)

    def size(self) -> int:
        if self.workers:
            return self.workers
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        return max(1, int(cpus // self.cpus_per_worker))

    def actors(self) -> list[Any]:
        if not self._actors:
            self._actors = [self._new() for _ in range(self.size())]
        return self._actors

    def _new(self) -> Any:
        actor = self._cls.remote()
        if self._setup is not None:
            actor.configure.remote(*self._setup)
        return actor

    def configure(self, model: nn.Module, strategy: Strategy) -> None:
        """Send the model and the strategy to every worker, once (and to replacements later)."""
        self._setup = (ray.put(model), ray.put(strategy))
        try:
            ray.get([a.configure.remote(*self._setup) for a in self.actors()])
        except LOST_ERRORS as error:
            raise BackendError(f"the Ray workers did not start: {type(error).__name__}") from None

    def stats(self) -> list[tuple[int, float, float]]:
        """Each live worker's :meth:`Worker.stats` (none of a worker that does not answer)."""
        answers = []
        for actor in self._actors:
            try:
                answers.append(ray.get(actor.stats.remote()))
            except ray.exceptions.RayError:  # died, or Ray itself went away: nothing to count
                continue
        return answers

    def replace(self, slot: int) -> None:
        """Put a fresh worker in ``slot`` (its worker died)."""
        ray.kill(self._actors[slot], no_restart=True)
        self._actors[slot] = self._new()

    def shutdown(self) -> None:
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors, self._setup = [], None


class RayClientRunner(ClientRunner):
    """Runs the clients' local updates on a :class:`WorkerPool` (see the module).

    Args:
        pool: the workers.
        reproducible: position each client's DP-SGD noise stream where the local backend would
            (``dp.reproducible``); False = a fresh OS-seeded stream per client.
    """

    def __init__(self, pool: WorkerPool, *, reproducible: bool = False) -> None:
        self.pool, self.reproducible = pool, reproducible
        self._data: list[Any] = []
        self._sizes: list[int] = []
        self._trainer: DPSGDTrainer | None = None
        self._n_parameters = 0
        self.depth = DEPTH
        """Tasks queued on one worker at once, >= 1."""
        self.chunk = 0
        """Clients trained by one task, >= 1; 0 = guided (see ``DEPTH``)."""
        self.tasks_sent = 0
        """Training tasks sent to the workers so far (fewer than the clients when runs form)."""
        self.redone = 0
        """Tasks re-run because their stream position was mispredicted (0 when it never is)."""
        self.data_sent = 0
        """Client data sets sent to workers so far (each worker gets a client's data once)."""
        self.vectors_sent = 0
        """Global vectors sent to workers so far (once a round to each worker that trains)."""
        self._round = 0
        """Rounds run so far: names the vector each task must train from."""
        self._sent: dict[int, tuple[Any, set[int], Any]] = {}
        """What each live worker was sent (by ``id`` of its handle: the handle, the clients whose
        data it holds, the reference of the last round vector it got); a fresh worker starts
        with nothing."""

    def start(self, *, model: nn.Module, strategy: Strategy, data: FederatedDataset) -> None:
        self._data = [ray.put(client) for client in data.clients]
        self._sizes = [len(client) for client in data.clients]
        self._trainer = find_dpsgd(strategy)
        self._n_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.pool.configure(model, strategy)

    def stop(self) -> None:
        self.pool.shutdown()
        self._data, self._sent = [], {}

    def run(self, vector: np.ndarray, tasks: Sequence[ClientTask]) -> Iterator[Outcome]:
        if not self._data:
            raise RuntimeError("RayClientRunner.run before start")
        vector_ref = ray.put(vector)
        self._round += 1
        stream = self._stream()
        results: list[Any] = [None] * len(tasks)
        first, position = 0, (stream[1] if stream is not None else 0)
        while first < len(tasks):
            plan = self._plan(tasks[first:], stream[0], position) if stream is not None else None
            results[first:] = self._dispatch(vector_ref, tasks[first:], plan)
            first, position = self._check(results, plan, first, position)
        if stream is not None and self._trainer is not None:
            self._trainer.optimizer.random.load_state_dict({"key": stream[0], "offset": position})
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, str):
                yield ClientFailure(task.client_id, result)
                continue
            local, reports, _ = result
            if self._trainer is not None:
                self._trainer.reports.extend(reports)
            yield local if local is not None else ClientFailure(task.client_id, "non-finite")

    def _stream(self) -> tuple[str, int] | None:
        if not self.reproducible or self._trainer is None:
            return None
        state = self._trainer.optimizer.random.state_dict()
        return str(state["key"]), int(state["offset"])

    def _plan(self, tasks: Sequence[ClientTask], key: str, position: int) -> list[tuple[str, int, int]]:
        """(key, start, predicted end) of each task's stream, back to back from ``position``."""
        assert self._trainer is not None
        plan = []
        for task in tasks:
            end = position + stream_bytes(self._trainer, self._sizes[task.client_id], self._n_parameters)
            plan.append((key, position, end))
            position = end
        return plan

    def _check(self, results: list[Any], plan: list[tuple[str, int, int]] | None, first: int,
               position: int) -> tuple[int, int]:
        """Walk the results from ``first``: return (len, final position) when every stream started
        where the one before ended, else (the first mispositioned task, where it must start)."""
        if plan is None:
            return len(results), position
        for offset, (_, start, predicted) in enumerate(plan):
            index = first + offset
            if start != position:
                self.redone += len(results) - index
                return index, position
            result = results[index]
            position = predicted if isinstance(result, str) or result[2] is None else result[2]
        return len(results), position

    def _dispatch(self, vector_ref: Any, tasks: Sequence[ClientTask],
                  plan: list[tuple[str, int, int]] | None) -> list[Any]:
        """Run ``tasks`` on the pool in runs of consecutive clients (``chunk``), ``depth`` runs
        at a time per worker (the next one queued while one trains), each to the first worker
        with room; the clients of a run whose worker died get ``"lost: ..."`` and a fresh worker
        takes the dead one's place."""
        actors = self.pool.actors()
        results: list[Any] = [None] * len(tasks)
        first = 0
        running: dict[Any, tuple[range, int, Any]] = {}
        free = [slot for _ in range(self.depth) for slot in range(len(actors))]
        while first < len(tasks) or running:
            while first < len(tasks) and free:
                size = self.chunk or max(1, (len(tasks) - first) // (self.depth * len(actors)))
                slot, run = free.pop(0), range(first, min(first + size, len(tasks)))
                first, actor = run.stop, actors[slot]
                streams = [None if plan is None else plan[i][:2] for i in run]
                ref = self._submit(actor, vector_ref, [tasks[i] for i in run], streams)
                running[ref] = (run, slot, actor)
                self.tasks_sent += 1
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                run, slot, actor = running.pop(ref)
                try:
                    results[run.start:run.stop] = ray.get(ref)
                except LOST_ERRORS as error:
                    results[run.start:run.stop] = [f"lost: {type(error).__name__}"] * len(run)
                    self._sent.pop(id(actor), None)
                    if self.pool.actors()[slot] is actor:  # the first of its tasks to report
                        self.pool.replace(slot)
                        actors = self.pool.actors()
                except ray.exceptions.RayTaskError as error:
                    cause = error.as_instanceof_cause()
                    if not isinstance(cause, LOST_ERRORS + (MissingInput,)):
                        raise cause from None
                    # the worker lives, but a client's data could not be fetched (a node lost), or a
                    # task before this one that carried what it needs failed so: send all again
                    results[run.start:run.stop] = [f"lost: {type(error.cause).__name__}"] * len(run)
                    self._sent.pop(id(actor), None)
                free.append(slot)
        return results

    def _submit(self, actor: Any, vector_ref: Any, tasks: Sequence[ClientTask],
                streams: list[tuple[str, int] | None]) -> Any:
        """Send one run of clients to ``actor``, with the round's vector if it has
        not had it yet and the data of the clients it has not held yet (each as a top-level
        argument, so Ray fetches it before the call and the worker keeps it)."""
        clients = [task.client_id for task in tasks]
        sent = self._sent.get(id(actor))
        if sent is None or sent[0] is not actor:
            sent = self._sent[id(actor)] = (actor, set(), None)
        _, held, last = sent
        fresh = [c for c in dict.fromkeys(clients) if c not in held]
        held.update(fresh)
        vector = None if last is vector_ref else vector_ref
        self._sent[id(actor)] = (actor, held, vector_ref)
        self.data_sent += len(fresh)
        self.vectors_sent += vector is not None
        return actor.update_many.remote(self._round, vector, clients, [task.seed for task in tasks], streams,
                                        fresh, *(self._data[c] for c in fresh))


class RayClientExecutor(ClientExecutor):
    """Hosts each masking round's honest clients on the pool's workers (clients spread evenly) and
    has every worker answer its clients' messages of a stage in parallel."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self._keys = itertools.count()

    def open(self, specs: Mapping[int, ClientSpec]) -> ClientCalls:
        return _RayCalls(self.pool, next(self._keys), specs)


class _RayCalls(ClientCalls):
    def __init__(self, pool: WorkerPool, key: int, specs: Mapping[int, ClientSpec]) -> None:
        self.pool, self.key = pool, key
        actors = pool.actors()
        self.slot_of = {c: i % len(actors) for i, c in enumerate(specs)}
        self.actors = {slot: actors[slot] for slot in set(self.slot_of.values())}
        self.lost: dict[int, str] = {}
        self.unhosted: dict[int, dict[int, ClientSpec]] = {slot: {} for slot in self.actors}
        """Each worker's clients, until they travel with its first messages (no round trip of
        their own)."""
        for c, spec in specs.items():
            self.unhosted[self.slot_of[c]][c] = spec

    def _wait(self, slot: int, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except LOST_ERRORS as error:
            self.lost[slot] = f"lost: {type(error).__name__}"
            self.pool.replace(slot)
            return None

    def handle(self, messages: Sequence[tuple[int, bytes]]) -> Iterator[tuple[int, Handled]]:
        groups: dict[int, list[tuple[int, bytes]]] = {}
        for client_id, message in messages:
            groups.setdefault(self.slot_of[client_id], []).append((client_id, message))
        refs = {slot: self.actors[slot].handle.remote(self.key, group, self.unhosted.pop(slot, None))
                for slot, group in groups.items() if slot not in self.lost}
        answers: dict[int, Handled] = {}
        for slot, ref in refs.items():
            for client_id, answer in self._wait(slot, ref) or ():
                answers[client_id] = answer
        for client_id, _ in messages:
            slot = self.slot_of[client_id]
            yield client_id, answers.get(client_id, Handled(lost=self.lost.get(slot, "lost")))

    def close(self) -> None:
        for slot, actor in self.actors.items():
            if slot not in self.lost:
                actor.release.remote(self.key)


def attach_ray(*, address: str, num_cpus: int, cpus_per_client: float, protocol: AggregationProtocol,
               reproducible: bool) -> RayClientRunner:
    """Connect to Ray, make the run's worker pool, host the masking layer's clients on it (if the
    protocol has one) and return the runner for the server loop."""
    connect(address=address, num_cpus=num_cpus)
    pool = WorkerPool(cpus_per_worker=cpus_per_client)
    masking = find_masking(protocol)
    if masking is not None:
        masking.client_executor = RayClientExecutor(pool)
    return RayClientRunner(pool, reproducible=reproducible)
