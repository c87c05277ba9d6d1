"""Runs one masked round in memory: the server, its clients, dropouts, and a transport.

Dropout stages: a client set to drop at stage s answers the stages before s and nothing from s on.
1 = after advertising keys, 2 = after sharing keys, 3 = after sending its masked input,
4 = during unmasking (in active mode 3 means it skips the consistency check too).

Where the honest clients compute is a :class:`ClientExecutor` ("map these client calls"): by
default every ``handle`` runs here, one after another, interleaved with the server's ``receive``
exactly as before. Another executor (the Ray backend, ``fedsec.backends``) builds each client from
its :class:`ClientSpec` where it runs and answers a stage's messages in parallel; the driver still
delivers the replies to the server in the order it sent the messages. A client whose executor loses
it (a worker died) stops answering, like a dropout, for the rest of the round.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked.client import ClientPolicy, MaskedClient
from fedsec.protocols.masked.graph import RingGraph, shuffled_ring
from fedsec.protocols.masked.messages import SESSION_BYTES
from fedsec.protocols.masked.server import MaskedServer
from fedsec.protocols.transport import InMemoryTransport, Transport
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.keys import SigningKey

DROP_STAGES = (1, 2, 3, 4)
_STAGE_INDEX = {"advertise keys": 0, "share keys": 1, "masked input": 2, "consistency check": 3,
                "unmask": 4}


@dataclass(frozen=True)
class ClientSpec:
    """Everything that builds one honest :class:`MaskedClient` (its constructor's arguments)."""

    client_id: int
    session: bytes
    round_index: int
    update: np.ndarray
    weight: int
    rng: np.random.Generator
    signing_key: SigningKey | None
    directory: Mapping[int, bytes] | None
    policy: ClientPolicy
    noise: Callable[[int], np.ndarray] | None

    def build(self) -> MaskedClient:
        return MaskedClient(client_id=self.client_id, session=self.session, round_index=self.round_index,
                            update=self.update, weight=self.weight, rng=self.rng,
                            signing_key=self.signing_key, directory=self.directory, policy=self.policy,
                            noise=self.noise)


@dataclass
class SimulatedRound:
    """A fresh session: its id, graph, server and one honest client per input (and the specs
    they were built from)."""

    session: bytes
    graph: RingGraph
    server: MaskedServer
    clients: dict[int, MaskedClient]
    specs: dict[int, ClientSpec] = field(default_factory=dict)


def build_round(*, updates: Mapping[int, np.ndarray], weights: Mapping[int, int],
                rngs: Mapping[int, np.random.Generator], encoder: FixedPointEncoder, degree: int,
                threshold: int, round_index: int,
                identities: Mapping[int, SigningKey] | None = None, active: bool = True,
                corrupt: float = 0.1, population: int | None = None,
                noise: Callable[[int], np.ndarray] | None = None,
                ring_rng: np.random.Generator | None = None,
                policy: ClientPolicy | None = None, server_workers: int = 1) -> SimulatedRound:
    """Set up one round: a random session id, the clients on a CSPRNG-shuffled ring of ``degree``.

    ``rngs`` feed each client's stochastic rounding. ``active`` (the default) runs authenticated
    mode with the clients' long-term ``identities`` (fresh ones when not given), and every client
    then insists on it; ``active=False`` is the semi-honest opt-in. ``corrupt`` is the fraction of
    colluding clients of the ``population`` (default: the clients of this round) that the server's
    check and every client's policy assume. ``policy`` (default: one built from ``active``,
    ``corrupt`` and ``population``) is every client's policy. ``noise``, if
    given, is each client's source of shifted integer noise (see :class:`MaskedClient`). ``ring_rng``
    (reproducible experiments only) shuffles the ring from a seed instead of the OS CSPRNG.
    ``server_workers`` is the server's ``workers`` (processes computing its unmask stage).
    """
    ids = list(updates)
    length = int(next(iter(updates.values())).size)
    graph = RingGraph(shuffled_ring(ids, ring_rng), degree)
    session = os.urandom(SESSION_BYTES)
    if active and identities is None:
        identities = {c: SigningKey.generate() for c in ids}
    directory = {c: identities[c].public for c in ids} if active else None
    server = MaskedServer(session=session, round_index=round_index, graph=graph, threshold=threshold,
                          encoder=encoder, length=length, active=active, directory=directory,
                          corrupt=corrupt, population=population or len(ids), workers=server_workers)
    if policy is None:
        policy = ClientPolicy(require_active=active, corrupt=corrupt, population=population or len(ids))
    specs = {
        c: ClientSpec(client_id=c, session=session, round_index=round_index, update=updates[c],
                      weight=weights[c], rng=rngs[c], signing_key=identities[c] if active else None,
                      directory=directory, policy=policy, noise=noise)
        for c in ids
    }
    return SimulatedRound(session, graph, server, {c: spec.build() for c, spec in specs.items()}, specs)


@dataclass(frozen=True)
class Handled:
    """One client's answer to one message.

    Attributes:
        reply: its reply (None: it sends nothing).
        abort: the :class:`ClientAbort` reason if it aborted, else None.
        seconds: time it spent on the message (wall clock where it ran).
        lost: the executor lost the client (its worker died): no reply, and none again this round.
    """

    reply: bytes | None = None
    abort: str | None = None
    seconds: float = 0.0
    lost: str | None = None


class ClientCalls(ABC):
    """The clients of one round, hosted where an executor runs them."""

    @abstractmethod
    def handle(self, messages: Sequence[tuple[int, bytes]]) -> Iterator[tuple[int, Handled]]:
        """Have each client handle its message; yield ``(client, answer)`` in the order given."""

    def close(self) -> None:
        """Release the round's clients (nothing by default)."""


class ClientExecutor(ABC):
    """Where the honest clients of simulated rounds compute."""

    @abstractmethod
    def open(self, specs: Mapping[int, ClientSpec]) -> ClientCalls:
        """Build one round's clients from their specs where they will run."""


class LocalCalls(ClientCalls):
    """The default: the given client objects, in this process, one after another, each message
    handled only when its answer is asked for (so a driver interleaves it with the server)."""

    def __init__(self, clients: Mapping[int, MaskedClient]) -> None:
        self.clients = clients

    def handle(self, messages: Sequence[tuple[int, bytes]]) -> Iterator[tuple[int, Handled]]:
        for client_id, message in messages:
            start = time.perf_counter()
            try:
                reply = self.clients[client_id].handle(message)
            except ClientAbort as abort:
                yield client_id, Handled(abort=abort.reason, seconds=time.perf_counter() - start)
                continue
            yield client_id, Handled(reply=reply, seconds=time.perf_counter() - start)


@dataclass
class RoundTrace:
    """What happened to each client, and the time each party spent: wall-clock seconds, and the
    server's CPU seconds per stage (every thread of the process while the server runs; on a shared
    machine less sensitive to other jobs than the wall clock)."""

    aborts: dict[int, str] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    client_seconds: dict[int, float] = field(default_factory=dict)
    server_stage_seconds: dict[str, float] = field(default_factory=dict)
    server_stage_cpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def server_seconds(self) -> float:
        return sum(self.server_stage_seconds.values())


def run_round(server: MaskedServer, clients: Mapping[int, MaskedClient], *,
              drop_at: Mapping[int, int] | None = None, transport: Transport | None = None,
              calls: ClientCalls | None = None) -> RoundTrace:
    """Drive ``server`` and ``clients`` until the round completes; ProtocolAbort propagates.

    ``calls`` (default: ``clients`` here, one after another) is where the clients handle their
    messages; the server receives the replies in the order of its outgoing messages either way."""
    transport = transport or InMemoryTransport()
    calls = calls if calls is not None else LocalCalls(clients)
    drops = dict(drop_at or {})
    trace = RoundTrace(client_seconds={c: 0.0 for c in clients})
    while not server.done:
        name = server.stage
        stage = _STAGE_INDEX[name]
        spent = cpu = 0.0
        start, start_cpu = time.perf_counter(), time.process_time()
        outgoing = server.outgoing()
        spent += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
        batch = []
        for client_id, message in outgoing.items():
            transport.to_client(client_id, message)
            if drops.get(client_id, 99) <= stage or client_id in trace.aborts or client_id in trace.lost:
                continue
            batch.append((client_id, message))
        for client_id, answer in calls.handle(batch):
            trace.client_seconds[client_id] = trace.client_seconds.get(client_id, 0.0) + answer.seconds
            if answer.lost is not None:
                trace.lost[client_id] = answer.lost
                continue
            if answer.abort is not None:
                trace.aborts[client_id] = answer.abort
                continue
            if answer.reply is not None:
                transport.to_server(client_id, answer.reply)
                start, start_cpu = time.perf_counter(), time.process_time()
                server.receive(client_id, answer.reply)
                spent += time.perf_counter() - start
                cpu += time.process_time() - start_cpu
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            server.close()
        finally:
            trace.server_stage_seconds[name] = spent + time.perf_counter() - start
            trace.server_stage_cpu_seconds[name] = cpu + time.process_time() - start_cpu
    return trace
