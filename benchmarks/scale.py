"""Scale: the Ray backend against the local one, and the largest federation in memory.

1. Speed: digits CNN, 50 clients (all of them every round), E = 5 local epochs, B = 10, pairwise
   masking (SecAgg, complete graph), no DP. The same configuration runs on the local backend
   (every client in this process) and on a local Ray of ``--cpus`` CPUs (``sim.backend = "ray"``:
   training and the masking clients on Ray workers, the server here), in this one process, one
   after the other in the order local, Ray, Ray, local (so a drift in the shared machine's load
   weighs on both); ``local_s`` and ``ray_s`` are the medians of their rounds. A round's time is
   the history's ``seconds`` (sampling to evaluation); Ray's start (connecting, starting the
   workers, putting the clients' data in the object store) is reported apart as ``ray_startup_s``.
2. Size: synthetic data, 10,000 clients, C = 0.01 (100 clients a round), SecAgg+ (Harary graph),
   logistic regression, no standardisation (its set-up round would mask all 10,000 clients at
   once), ``secure.corrupt`` 0.001 of the population (10 colluders; at 0.01 no threshold is safe
   for 100 clients a round), on the local backend, in a fresh process: its round time and its
   peak resident memory (``resource.getrusage``), with the memory after importing fedsec and
   torch as the reference.

    python -m benchmarks.scale [--rounds 3] [--cpus 2] [--clients 10000]

The reference measured in the same run, ``parallel_capacity``, is how many cores ``--cpus``
processes running a fixed CPU-bound job at once get on the machine at that moment (CPU seconds
over wall seconds; 2.0 on an idle 2-core machine): on a shared machine it bounds any backend's
speedup.

The CPU-bound ratio, ``cpu_ratio``, is the CPU seconds a Ray round takes (the driver, the workers
and Ray's daemons: this process tree, from /proc) over a local round's (medians over the rounds
after each run's first): the work Ray adds. ``speedup_bound`` = min(cpus, parallel_capacity) /
cpu_ratio is the speedup Ray would reach if its rounds kept every core it got busy.
``local_cpu_roles`` / ``ray_cpu_roles`` split a round's CPU seconds (medians) between the
``driver`` (this process), the ``workers`` (Ray's actor processes) and Ray's ``daemons`` (raylet,
GCS and helpers; their share grows with a round's wall time, since they also tick while idle).
``ray_worker_calls`` counts the workers' calls a round (training tasks, masking stages) and the
share of the workers' CPU spent inside them (the clients' own work): the rest is Ray's.

Last stdout line: {"local_s", "ray_s", "speedup", "ray_startup_s", "parallel_capacity", "local_cpu_s",
"ray_cpu_s", "cpu_ratio", "speedup_bound", "local_cpu_roles", "ray_cpu_roles", "ray_worker_calls", "rounds",
"cpus", "workload",
"federation": {"clients", "per_round", "round_s", "peak_rss_mb", "import_rss_mb", ...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import emit, log

WORKLOAD = {"seed": 0, "data.dataset": "digits", "data.clients": 50, "model.name": "cnn",
            "train.local_epochs": 5, "train.batch_size": 10, "train.fraction": 1.0,
            "secure.aggregation": "masking", "dp.mode": "none"}


def federation_config(clients: int, rounds: int) -> dict[str, Any]:
    return {"seed": 0, "rounds": rounds, "data.dataset": "synthetic", "data.clients": clients,
            "data.samples": 10 * clients, "data.standardize": False, "model.name": "logreg",
            "train.fraction": 0.01, "secure.aggregation": "masking", "secure.graph": "harary",
            "secure.corrupt": 0.001, "dp.mode": "none"}


def _spin(_: int = 0) -> tuple[float, float]:
    """A fixed CPU-bound job (AES-CTR over 4 GiB, as the masks are): its wall and CPU seconds."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    wall, cpu = time.perf_counter(), time.process_time()
    encryptor = Cipher(algorithms.AES(bytes(32)), modes.CTR(bytes(16))).encryptor()
    block = bytes(1 << 20)
    for _ in range(4096):
        encryptor.update(block)
    return time.perf_counter() - wall, time.process_time() - cpu


def parallel_capacity(cpus: int) -> float:
    """How many cores ``cpus`` processes get at once on this machine right now: the CPU seconds
    of the same job run in each of them at once, over the longest one's wall seconds. 2.0 on an
    idle 2-core machine; near 1 or below when other jobs take the rest (then no backend can run 2x
    faster than one process)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(cpus) as pool:
        pool.map(_spin, range(cpus), chunksize=1)  # warm the processes
        runs = pool.map(_spin, range(cpus), chunksize=1)
    return sum(cpu for _, cpu in runs) / max(wall for wall, _ in runs)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tree_cpu_seconds() -> dict[int, float] | None:
    """CPU seconds (user + system) used so far by this process and each live descendant (the
    local Ray's daemons and workers), by process id, from /proc; None where there is no /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(name)] = int(fields[1])
        used[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = {}, [os.getpid()]
    while todo:
        pid = todo.pop()
        tree[pid] = used.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return tree


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the tree used between two snapshots (a process that ended in between is not
    counted; one that started is, in full)."""
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


ROLES = ("driver", "workers", "daemons")


def role(pid: int) -> str:
    """``driver`` (this process), ``workers`` (a Ray actor process: its name starts
    ``ray::Worker``) or ``daemons`` (the rest of the tree: the raylet, GCS, Ray's helpers)."""
    if pid == os.getpid():
        return "driver"
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        return "daemons"
    return "workers" if name.startswith("ray::Worker") else "daemons"


def cpu_by_role(before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """:func:`cpu_between`, split by :func:`role`."""
    split = dict.fromkeys(ROLES, 0.0)
    for pid, cpu in after.items():
        split[role(pid)] += max(0.0, cpu - before.get(pid, 0.0))
    return split


def cpu_observer() -> Any:
    """A round observer that records the CPU seconds of this process tree (driver, Ray workers
    and daemons) during each round, in its ``rounds`` list, and split by :func:`role` in
    ``roles``; given a Ray ``runner``, also its workers' :meth:`~fedsec.backends.ray_runner.Worker.stats`
    after each round (asked after the round's CPU is read), in ``workers``."""
    from fedsec.fl_core.history import RoundObserver

    class CPUPerRound(RoundObserver):
        def __init__(self) -> None:
            self.start: dict[int, float] | None = None
            self.rounds: list[float] = []
            self.roles: list[dict[str, float]] = []
            self.runner: Any = None
            self.workers: list[tuple[int, float, float]] = []

        def before_round(self, round_index: int) -> None:
            self.start = tree_cpu_seconds()

        def after_round(self, record: Any) -> None:
            end = tree_cpu_seconds()
            if self.start is not None and end is not None:
                self.rounds.append(cpu_between(self.start, end))
                self.roles.append(cpu_by_role(self.start, end))
            if hasattr(self.runner, "pool"):
                self.workers = self.runner.pool.stats()

    return CPUPerRound()


def round_seconds(values: dict[str, Any]
                  ) -> tuple[list[float], float, list[float], list[dict[str, float]], dict[str, float]]:
    """Per-round seconds of one run, its wall time outside the rounds (start-up), the CPU
    seconds of the whole process tree in each round, the same split by :func:`role`, and (Ray
    runs) the workers' calls and the CPU seconds inside them over the whole run (``calls``,
    ``in_calls_s``, ``training_tasks``; empty for the local backend)."""
    from fedsec.config import make_config
    from fedsec.experiment import build_experiment

    cpu = cpu_observer()
    start = time.perf_counter()
    experiment = build_experiment(make_config(values), observers=[cpu])
    cpu.runner = experiment.server.runner
    result = experiment.server.run()
    wall = time.perf_counter() - start
    seconds = [r.seconds for r in result.records]
    if any(r.status != "ok" for r in result.records):
        raise RuntimeError(f"a round aborted: {[r.status for r in result.records]}")
    workers = cpu.workers
    calls = ({"calls": sum(c for c, _, _ in workers), "in_calls_s": sum(b for _, b, _ in workers),
              "training_tasks": cpu.runner.tasks_sent} if workers else {})
    return seconds, wall - sum(seconds), cpu.rounds, cpu.roles, calls


def median_roles(rounds: list[dict[str, float]]) -> dict[str, float] | None:
    """The median CPU seconds a round of each :func:`role`, or None without measurements."""
    if not rounds:
        return None
    return {name: round(statistics.median(r[name] for r in rounds), 3) for name in ROLES}


def worker_calls(totals: dict[str, float]) -> dict[str, float] | None:
    """The Ray runs' worker calls a round (training tasks and masking stages), the training tasks
    a round, and ``in_calls``: the share of the workers' CPU (every round, from /proc) spent inside
    the calls (the clients' own work; the rest is Ray's: (de)serialising, its threads, waking)."""
    if not totals["rounds"] or not totals["workers_s"]:
        return None
    return {"calls": round(totals["calls"] / totals["rounds"], 1),
            "training_tasks": round(totals["training_tasks"] / totals["rounds"], 1),
            "in_calls": round(totals["in_calls_s"] / totals["workers_s"], 3)}


def federation(clients: int, rounds: int) -> dict[str, Any]:
    """Part 2, run in its own process so its peak memory is its own."""
    import torch

    from fedsec.config import make_config
    from fedsec.experiment import build_experiment

    torch.set_num_threads(1)
    imported = peak_rss_mb()
    start = time.perf_counter()
    experiment = build_experiment(make_config(federation_config(clients, rounds)))
    built = time.perf_counter() - start
    result = experiment.server.run()
    last = result.records[-1]
    return {"clients": clients, "per_round": last.participants + last.dropped,
            "round_s": statistics.median(r.seconds for r in result.records),
            "rounds": [round(r.seconds, 3) for r in result.records], "build_s": round(built, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1), "import_rss_mb": round(imported, 1),
            "secagg_degree": int(last.metrics["secagg_degree"]),
            "secagg_threshold": int(last.metrics["secagg_threshold"]),
            "participants": [r.participants for r in result.records]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each of the four speed runs")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--clients", type=int, default=10000, help="clients of the size run")
    parser.add_argument("--federation-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.federation_only:
        emit(federation(args.clients, 2))
        return
    import torch

    torch.set_num_threads(1)
    log(f"size: {args.clients} clients, SecAgg+ (fresh process)")
    done = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--federation-only",
                           "--clients", str(args.clients)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=True)
    size = json.loads(done.stdout.strip().splitlines()[-1])
    log(f"size: {size}")
    speed = {**WORKLOAD, "rounds": args.rounds}
    ray_config = {**speed, "sim.backend": "ray", "sim.num_cpus": args.cpus}
    local: list[float] = []
    remote: list[float] = []
    local_cpu: list[float] = []
    remote_cpu: list[float] = []
    startups: list[float] = []
    roles: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    in_calls = {"calls": 0.0, "in_calls_s": 0.0, "training_tasks": 0.0, "workers_s": 0.0, "rounds": 0.0}
    for backend in ("local", "ray", "ray", "local"):  # ABBA: drift in the machine's load cancels
        log(f"speed: {backend} backend" + (f", {args.cpus} CPUs" if backend == "ray" else ""))
        seconds, startup, cpu, split, calls = round_seconds(speed if backend == "local" else ray_config)
        if calls:
            for key, value in calls.items():
                in_calls[key] += value
            in_calls["workers_s"] += sum(r["workers"] for r in split)
            in_calls["rounds"] += len(seconds)
        roles[backend].extend(split[1:])
        (local if backend == "local" else remote).extend(seconds)
        # the first round of a run warms caches and (on Ray) the workers' imports: left out
        (local_cpu if backend == "local" else remote_cpu).extend(cpu[1:])
        if backend == "ray":
            startups.append(startup)
        log(f"{backend} rounds: {seconds}, CPU s: {[round(c, 3) for c in cpu]}")
    local_s, ray_s = statistics.median(local), statistics.median(remote)
    cpu_ratio = (statistics.median(remote_cpu) / statistics.median(local_cpu)
                 if local_cpu and remote_cpu and statistics.median(local_cpu) > 0 else None)
    capacity = parallel_capacity(args.cpus)
    log(f"parallel capacity of {args.cpus} processes: {capacity:.2f}")
    emit({"local_s": round(local_s, 3), "ray_s": round(ray_s, 3), "speedup": round(local_s / ray_s, 2),
          "ray_startup_s": round(statistics.median(startups), 2),
          "parallel_capacity": round(capacity, 2), "rounds": args.rounds, "cpus": args.cpus,
          "local_cpu_s": round(statistics.median(local_cpu), 3) if local_cpu else None,
          "ray_cpu_s": round(statistics.median(remote_cpu), 3) if remote_cpu else None,
          "cpu_ratio": round(cpu_ratio, 3) if cpu_ratio is not None else None,
          "speedup_bound": (round(min(args.cpus, capacity) / cpu_ratio, 2) if cpu_ratio else None),
          "local_cpu_roles": median_roles(roles["local"]), "ray_cpu_roles": median_roles(roles["ray"]),
          "ray_worker_calls": worker_calls(in_calls),
          "local_rounds": [round(s, 3) for s in local], "ray_rounds": [round(s, 3) for s in remote],
          "workload": "digits cnn, 50 clients, E=5, B=10, masking (complete), no DP",
          "federation": size, "machine_cpus": os.cpu_count()})


if __name__ == "__main__":
    main()
