"""Pairwise-mask secure aggregation: client and server time, upload, exactness.

N clients with M float32 parameters each (normal, sd 0.1) and integer weights in [1, 64] run one
round (16-bit quantisation, clip 1). A fraction F of the clients drop out, by default right after
sharing their keys (``--dropout-stage 2``), the costliest case for the server: it must rebuild
their mask keys and regenerate every pairwise mask they shared with a survivor.

    python -m benchmarks.secagg --clients 100 --params 100000 --dropout 0.1 --graph complete
    python -m benchmarks.secagg --clients 1000 --params 100000 --dropout 0.1 --graph harary

The round runs in authenticated (active) mode, the default: signed keys and share commitments,
signed partner attestations, and the survivor list signed by a quorum that every client checks
(``--semi-honest`` runs the unauthenticated opt-in instead).

Last stdout line (JSON): active, quorum, client_s_mean, client_s_max (seconds of one client's work over the
round), server_s, degree, threshold, dropped, upload_bytes_per_client (mean over the clients
whose input is in the sum), expansion (that / 4M), exact (the unmasked sum equals the plain
sum of the survivors' encoded inputs, checked), server_unmask_s (the unmask stage: taking the
shares, rebuilding the secrets, regenerating and removing the masks), server_stage_s (every
stage), masks_regenerated, raw_aes_s (AES-256-CTR alone over the same mask bytes, one core),
server_over_raw_aes and unmask_over_raw_aes; server_masks_s (inside the unmask stage: AES-CTR over
the regenerated masks and adding them into the total), server_rest_s (every other second of the
server) and server_profile (the unmask stage's close: rebuilding secrets, deriving mask keys,
regenerating masks); masks_over_raw_aes and rest_over_raw_aes; server_cpu_s, server_stage_cpu_s,
raw_aes_cpu_s and server_cpu_over_raw_aes_cpu, the same in CPU seconds (all the process's threads
while the server runs: on a shared machine, less sensitive to other jobs than the wall clock, and
blind to the server's use of a second core).

The server runs with ``--workers W`` processes for its unmask stage (``MaskedServer(workers=W)``,
default 2 = this process and one worker; 1 = one process). The pool is spawned and warmed before
the round (pool_start_s, not part of the server's time: a deployment spawns it once and reuses it
every round); server_workers_cpu_s is the CPU the worker processes spent during the round, and
server_all_cpu_over_raw_aes_cpu counts it with the server's own CPU.

Each stage's clients all compute before the server takes their answers (in the same order), as
in a deployment where the clients compute on their own machines: the server's calls follow one
another instead of alternating with 1000 simulated clients' work in the same process, which
evicted the server's caches between any two of its calls and charged it page faults of the
clients' 1.5 GB heap (0.5-0.6 s of CPU in the runs of issue 16's session 6). ``--interleaved``
runs the round the old way.

``--replay N`` feeds the round's recorded answers to N fresh servers (same session, ring and
directory) with nothing between their messages, each checked to give the same sum: replay_s,
replay_cpu_s and replay_workers_cpu_s (one entry per server), replay_over_raw_aes,
replay_cpu_over_raw_aes_cpu and replay_all_cpu_over_raw_aes_cpu (medians over the AES
reference); with ``--workers`` > 1, each is followed by a one-process server fed the same answers
(the replay_single_* fields), so the two are measured interleaved in the same minutes.

The reference, raw_aes_s, is measured in the same run, after the round, with the same primitive
(``cryptography``'s AES-256-CTR) on one core: the floor for a server that must regenerate those
masks. The goal for SecAgg+ at 1000 clients x 100k parameters, 10% dropout, is
server_over_raw_aes <= 2.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from fedsec.protocols.masked import MaskedServer, choose_parameters, run_round
from fedsec.protocols.masked.policy import survivor_quorum
from fedsec.protocols.masked.simulation import DROP_STAGES, ClientCalls, LocalCalls, build_round
from fedsec.protocols.masked.workers import shared_pool
from fedsec.protocols.transport import InMemoryTransport
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.keys import SigningKey

from benchmarks._common import emit, log

MAX_WEIGHT = 64


def build(n: int, length: int, *, graph: str, dropout: float, active: bool, seed: int, workers: int = 1):
    rng = np.random.default_rng(seed)
    ids = list(range(1, n + 1))
    chosen = choose_parameters(n, dropout=max(0.1, dropout), corrupt=0.1, graph=graph, active=active)
    encoder = FixedPointEncoder(clip=1.0, bits=16, max_clients=n, max_weight=MAX_WEIGHT, max_length=length)
    updates = {c: rng.normal(0, 0.1, length).astype(np.float32) for c in ids}
    weights = {c: int(rng.integers(1, MAX_WEIGHT + 1)) for c in ids}
    seeds = {c: int(rng.integers(0, 2**32)) for c in ids}
    built = build_round(updates=updates, weights=weights,
                        rngs={c: np.random.default_rng(seeds[c]) for c in ids}, encoder=encoder,
                        degree=chosen.degree, threshold=chosen.threshold, round_index=1,
                        identities={c: SigningKey.generate() for c in ids} if active else None,
                        active=active, corrupt=0.1, server_workers=workers)
    return built.server, built.clients, encoder, built.graph, chosen, updates, weights, seeds


def raw_aes_seconds(masks: int, nbytes: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds of AES-256-CTR alone producing ``masks`` keystreams of ``nbytes``
    each, on one core."""
    zeros, out = bytes(nbytes), bytearray(nbytes + 15)
    keys = [os.urandom(32) for _ in range(min(masks, 64))]
    start, start_cpu = time.perf_counter(), time.process_time()
    for i in range(masks):
        Cipher(algorithms.AES(keys[i % len(keys)]), modes.CTR(bytes(16))).encryptor().update_into(zeros, out)
    return time.perf_counter() - start, time.process_time() - start_cpu


class StageAtOnce(ClientCalls):
    """The clients of a stage all compute before the server takes their answers (in the same
    order): the server's calls then follow one another as in a deployment, where the clients
    compute elsewhere, instead of alternating with client work in the same process."""

    def __init__(self, inner: ClientCalls) -> None:
        self.inner = inner

    def handle(self, messages):  # type: ignore[no-untyped-def]
        return iter(list(self.inner.handle(messages)))


class _Recorder:
    """The server as :func:`run_round` drives it, keeping every answer it receives in order (for
    ``--replay``: the same round fed again to a fresh server with nothing between its messages)."""

    def __init__(self, server) -> None:  # type: ignore[no-untyped-def]
        self.server, self.stages = server, []

    done = property(lambda self: self.server.done)
    stage = property(lambda self: self.server.stage)

    def outgoing(self) -> dict[int, bytes]:
        self.stages.append([])
        return self.server.outgoing()

    def receive(self, sender: int, data: bytes) -> None:
        self.stages[-1].append((sender, data))
        self.server.receive(sender, data)

    def close(self) -> None:
        self.server.close()


def replay_seconds(server, stages, total: np.ndarray, *, population: int,  # type: ignore[no-untyped-def]
                   workers: int) -> tuple[float, float, float]:
    """Wall-clock seconds, CPU seconds of this process and CPU seconds of its worker processes of
    a fresh server equal to ``server`` (same session, ring, directory, corrupt fraction 0.1 of
    ``population``, ``workers`` processes for the unmask stage) fed the recorded answers of every
    stage; its sum must equal ``total``."""
    r = server._round
    fresh = MaskedServer(session=r.session, round_index=r.round_index, graph=r.graph,
                         threshold=r.params.threshold, encoder=r.encoder, length=r.params.length,
                         active=r.params.active, directory=r.directory or None, corrupt=0.1,
                         population=population, workers=workers)
    children = worker_cpu_seconds(workers)
    start, start_cpu = time.perf_counter(), time.process_time()
    for answers in stages:
        fresh.outgoing()
        for sender, data in answers:
            fresh.receive(sender, data)
        fresh.close()
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    children = worker_cpu_seconds(workers) - children
    if not np.array_equal(fresh.result()[0], total):
        raise AssertionError("the replayed round gave another sum")
    return wall, cpu, children


def worker_cpu_seconds(workers: int) -> float:
    """CPU seconds (user + system) spent so far by the shared pool's worker processes of this size
    (0 for 1 worker), read from /proc."""
    if workers < 2:
        return 0.0
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in shared_pool(workers).pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def replay_fields(name: str, runs: list[tuple[float, float, float]], raw: float,
                  raw_cpu: float) -> dict[str, object]:
    """The JSON fields of a list of replays: seconds, ratios of the medians to the AES reference."""
    if not runs:
        return {}
    wall, cpu, children = (float(np.median([r[i] for r in runs])) for i in range(3))
    return {f"{name}_s": [round(r[0], 4) for r in runs], f"{name}_cpu_s": [round(r[1], 4) for r in runs],
            f"{name}_workers_cpu_s": [round(r[2], 3) for r in runs],
            f"{name}_over_raw_aes": round(wall / raw, 2) if raw > 0 else None,
            f"{name}_cpu_over_raw_aes_cpu": round(cpu / raw_cpu, 2) if raw_cpu > 0 else None,
            f"{name}_all_cpu_over_raw_aes_cpu": round((cpu + children) / raw_cpu, 2) if raw_cpu > 0 else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--params", type=int, default=100_000)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--graph", choices=("complete", "harary"), default="complete")
    parser.add_argument("--dropout-stage", default="2", choices=("random",) + tuple(map(str, DROP_STAGES)))
    parser.add_argument("--semi-honest", action="store_true",
                        help="the unauthenticated opt-in (no signatures, no consistency check)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay", type=int, default=0,
                        help="after the round, feed its recorded answers to this many fresh servers")
    parser.add_argument("--interleaved", action="store_true",
                        help="the server takes each answer as soon as its client computed it, so the "
                             "clients' work runs between the server's calls (the benchmark before "
                             "issue 16's session 6; charges the server for the clients' cache misses)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes computing the server's unmask stage, its own included "
                             "(MaskedServer(workers=...)); 1 = one process")
    args = parser.parse_args()
    if not 1 <= args.workers <= 64:
        parser.error("--workers must be in [1, 64]")
    pool_start = time.perf_counter()
    if args.workers > 1:
        shared_pool(args.workers).warm()  # spawned once per process, reused by every round after
    pool_start = time.perf_counter() - pool_start

    active = not args.semi_honest
    warm = build(5, 16, graph="complete", dropout=0.1, active=active, seed=1, workers=args.workers)
    run_round(warm[0], warm[1])

    server, clients, encoder, ring, chosen, updates, weights, seeds = build(
        args.clients, args.params, graph=args.graph, dropout=args.dropout, active=active, seed=args.seed,
        workers=args.workers)
    rng = np.random.default_rng(args.seed + 1)
    n_drop = int(round(args.dropout * args.clients))
    victims = rng.choice(sorted(clients), size=n_drop, replace=False)
    def stage() -> int:
        return int(rng.choice(DROP_STAGES)) if args.dropout_stage == "random" else int(args.dropout_stage)

    drops = {int(c): stage() for c in victims}
    transport = InMemoryTransport()
    # All N simulated clients share one Python heap, where a real party's heap holds only its own
    # objects: the cyclic collector is paused for the round so that a collection over everybody's
    # objects is not billed to whichever party happened to allocate (reference counting still
    # frees memory as usual).
    gc.collect()
    gc.disable()
    log(f"degree {chosen.degree}, threshold {chosen.threshold}, {n_drop} dropouts; running the round")
    start = time.perf_counter()
    children = worker_cpu_seconds(args.workers)
    try:
        recorder = _Recorder(server)  # keeps every answer only when asked to replay them
        calls = LocalCalls(clients) if args.interleaved else StageAtOnce(LocalCalls(clients))
        trace = run_round(recorder if args.replay > 0 else server, clients, drop_at=drops,
                          transport=transport, calls=calls)
    finally:
        gc.enable()
    wall = time.perf_counter() - start
    children = worker_cpu_seconds(args.workers) - children
    total, survivors = server.result()

    expected = np.zeros(args.params + 2, dtype=np.uint64)
    for c in survivors:
        expected += encoder.encode(updates[c], weights[c], rng=np.random.default_rng(seeds[c])).words
    expected = encoder.reduce(expected.astype(encoder.dtype))
    alive = set(survivors)
    dropped_in_sum = [c for c in clients if c not in alive]
    masks = len(survivors) + sum(
        sum(1 for v in ring.neighbours(d) if v in alive) for d in dropped_in_sum if drops.get(d, 99) > 1)
    word_bytes = encoder.dtype.itemsize * (args.params + 2)
    replays, singles = [], []
    if args.replay > 0:
        gc.collect()
        gc.disable()
        try:  # interleaved: the configured server, then the one-process server, and again
            for _ in range(args.replay):
                replays.append(replay_seconds(server, recorder.stages, total, population=args.clients,
                                              workers=args.workers))
                if args.workers > 1:
                    singles.append(replay_seconds(server, recorder.stages, total,
                                                  population=args.clients, workers=1))
        finally:
            gc.enable()
    raw, raw_cpu = raw_aes_seconds(masks, word_bytes)
    server_cpu = sum(trace.server_stage_cpu_seconds.values())
    times = [trace.client_seconds[c] for c in clients if c not in drops]
    upload = float(np.mean([transport.uploaded[c] for c in survivors]))
    profile = server.profile
    masks_s = profile.get("masks", 0.0)
    emit({
        "clients": args.clients, "params": args.params, "graph": args.graph, "active": active,
        "quorum": survivor_quorum(args.clients, 0.1, population=args.clients) if active else 0,
        "dropout": args.dropout, "dropout_stage": args.dropout_stage,
        "client_s_mean": round(float(np.mean(times)), 4), "client_s_max": round(float(np.max(times)), 4),
        "server_s": round(trace.server_seconds, 4), "degree": chosen.degree, "threshold": chosen.threshold,
        "dropped": len(dropped_in_sum), "upload_bytes_per_client": round(upload),
        "expansion": round(upload / (4 * args.params), 4),
        "exact": bool(np.array_equal(total, expected)),
        "server_unmask_s": round(trace.server_stage_seconds["unmask"], 4),
        "server_stage_s": {k: round(v, 4) for k, v in trace.server_stage_seconds.items()},
        "masks_regenerated": masks, "raw_aes_s": round(raw, 4),
        "server_over_raw_aes": round(trace.server_seconds / raw, 2) if raw > 0 else None,
        "unmask_over_raw_aes": round(trace.server_stage_seconds["unmask"] / raw, 2) if raw > 0 else None,
        "server_masks_s": round(masks_s, 4), "server_rest_s": round(trace.server_seconds - masks_s, 4),
        "server_profile": {k: round(v, 4) for k, v in profile.items()},
        "masks_over_raw_aes": round(masks_s / raw, 2) if raw > 0 else None,
        "rest_over_raw_aes": round((trace.server_seconds - masks_s) / raw, 2) if raw > 0 else None,
        "server_cpu_s": round(server_cpu, 4),
        "server_stage_cpu_s": {k: round(v, 4) for k, v in trace.server_stage_cpu_seconds.items()},
        "raw_aes_cpu_s": round(raw_cpu, 4),
        "server_cpu_over_raw_aes_cpu": round(server_cpu / raw_cpu, 2) if raw_cpu > 0 else None,
        "interleaved": args.interleaved, "workers": args.workers, "pool_start_s": round(pool_start, 3),
        "server_workers_cpu_s": round(children, 3),
        "server_all_cpu_over_raw_aes_cpu": (round((server_cpu + children) / raw_cpu, 2) if raw_cpu > 0
                                            else None),
        **replay_fields("replay", replays, raw, raw_cpu),
        **replay_fields("replay_single", singles, raw, raw_cpu),
        "client_aborts": len(trace.aborts), "modulus_bits": encoder.modulus_bits,
        "wall_s": round(wall, 2),
    })


if __name__ == "__main__":
    main()
