"""A deployed federation against the in-memory simulation of the same plan, in one run.

    python -m benchmarks.deploy [--sites N] [--params M] [--rounds R] [--rows ROWS] [--timeline DIR]

The plan: N sites, each with its own CSV file of ROWS synthetic records, a model of about M
parameters (``logreg`` with M - 1 features below 50k parameters, else the ``mlp``, 200 M / 200
features), masking on the complete graph, no DP (``dp.mode = none``: the comparison is of the
deployment, not of the noise), R rounds. It is run twice: ``fedsec run`` in this process, and
``fedsec serve`` with N ``fedsec join`` processes on 127.0.0.1 (gRPC + mutual TLS). Per-round
seconds are the medians of history.csv's ``seconds`` (training, the masked sum, the federated
evaluation), round 1 left out (it includes the sites' first model set-up).

Wire bytes are counted by the coordinator's transport: every gRPC message (framing headers and
chunks; not TLS or HTTP/2 framing) each site sent and received over the whole run. The protocol's
count is the secure layer's own messages (what the simulation's in-memory transport counts), plus
the model the framework must send a site: once a round with its evaluation job, and with round 1's
training job (a later training job names the model the site evaluated last, by its SHA-256, which
the protocol's count leaves out as the framing's); the ratio is wire over that.

CPU: every process's CPU seconds (user + system, from ``/proc``; this process's own for the
simulation) are sampled every 20 ms and split into rounds at the ``round`` rows of the
coordinator's and the simulation's audit logs; ``cpu_seconds_per_round`` is the mean over rounds
2..R. ``cpu_seconds_by_thread`` splits the whole life of the coordinator and of one site by thread
name (gRPC's C threads, the server's pool, the audit writer, the main thread; read every 0.5 s, so
up to the last half second of each process's life). ``sampler_cpu_share`` is the sampler thread's
own CPU over its wall time in each phase (it shares the cores it measures). ``calls_per_round``
counts the calls the coordinator served a round. With ``cores`` cores, no schedule runs a deployed
round in less than its total CPU seconds over ``cores``: ``cpu_floor_over_simulated`` is that floor
over the simulated round's seconds (the ratio the deployment could reach on this machine if every
CPU second ran in parallel). The load
average before and after is reported: other jobs share the cores.

With ``--timeline DIR`` every party runs under :mod:`benchmarks.timeline_process` (the
coordinator's exchanges and the answers' arrival times, each site's jobs with their main-thread
CPU) and ``timeline`` reports, for each exchange of a round in order, its wall time, the arrival
of the first and last answers, the delivery and wake-up of the last site (``pickup``), the
slowest site's work, the sites' summed CPU and the coordinator's own time before it
(:func:`timeline`). The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks._common import emit, log

LOGREG_LIMIT = 50_000
MLP_FIXED = 200 + 200 * 200 + 200 + 200 + 1
"""Parameters of the MLP that do not grow with the features (binary task)."""


def shape_for(params: int) -> tuple[str, int]:
    """(model, features) whose parameter count is closest to ``params``."""
    if params < LOGREG_LIMIT:
        return "logreg", max(1, params - 1)
    return "mlp", max(1, round((params - MLP_FIXED) / 200))


def write_data(folder: Path, sites: int, features: int, rows: int) -> tuple[list[Path], list[str]]:
    rng = np.random.default_rng(0)
    columns = [f"x{i}" for i in range(features)]
    truth = rng.normal(size=features)
    paths = []
    for k in range(sites):
        x = rng.normal(size=(rows, features)).astype(np.float32)
        y = (x @ truth > 0).astype(int)
        path = folder / f"site-{k}.csv"
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([*columns, "y"])
            writer.writerows([*(f"{v:.4g}" for v in row), int(label)]
                             for row, label in zip(x, y, strict=True))
        paths.append(path)
    return paths, columns


def plan(sites: list[str], columns: list[str], model: str, rounds: int) -> str:
    cols = ", ".join(f'"{c}"' for c in columns)
    roster = ", ".join(f'"{s}"' for s in sites)
    return (f"seed = 0\nrounds = {rounds}\n[data]\ndataset = \"csv\"\nclients = {len(sites)}\nlabel = \"y\"\n"
            f"classes = [\"0\", \"1\"]\ncolumns = [{cols}]\nstandardize = false\n"
            f"[model]\nname = \"{model}\"\n"
            f"[train]\nbatch_size = 0\n[secure]\naggregation = \"masking\"\ngraph = \"complete\"\n"
            f"[dp]\nmode = \"none\"\n[federation]\nsites = [{roster}]\nmin_sites = 3\nstage_timeout = 120.0\n"
            f"join_timeout = 600.0\n")


def median_seconds(history: Path) -> float:
    rows = list(csv.DictReader(open(history)))
    values = [float(r["seconds"]) for r in rows[1:]] or [float(rows[0]["seconds"])]
    return statistics.median(values)


class CpuSampler:
    """CPU seconds of processes (``None``: this one), sampled every ``period`` seconds."""

    def __init__(self, period: float = 0.02, thread_period: float = 0.5) -> None:
        self.period, self.thread_period = period, thread_period
        self.own_cpu = self.own_wall = 0.0
        """The sampler thread's own CPU and wall seconds (its cost: it shares the cores it measures)."""
        self.pids: dict[str, int | None] = {}
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self.threads: dict[str, dict[int, tuple[str, float]]] = {}
        """``name -> {thread id: (thread name, CPU seconds)}`` at the last sample, for the
        processes watched with ``threads=True``."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, name: str, pid: int | None, *, threads: bool = False) -> None:
        self.samples[name] = []
        self.pids[name] = pid
        if threads:
            self.threads[name] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        cpu, wall = time.thread_time(), time.monotonic()
        threads_due = 0.0
        while not self._stop.is_set():
            now = time.time()
            # the per-thread split is a whole-life total: read every thread_period, not every tick
            # (a 50-thread coordinator read every 20 ms cost the sampler several % of a core)
            with_threads = now >= threads_due
            if with_threads:
                threads_due = now + self.thread_period
            for name, pid in list(self.pids.items()):
                if pid is None:
                    usage = resource.getrusage(resource.RUSAGE_SELF)
                    self.samples[name].append((now, usage.ru_utime + usage.ru_stime))
                    continue
                text = _read_stat(f"/proc/{pid}/stat")
                if text is None:
                    continue
                fields = text.rpartition(")")[2].split()
                self.samples[name].append((now, (int(fields[11]) + int(fields[12])) / tick))
                if with_threads and name in self.threads:
                    self._threads(name, pid, tick)
            self._stop.wait(self.period)
        self.own_cpu, self.own_wall = time.thread_time() - cpu, time.monotonic() - wall

    def _threads(self, name: str, pid: int, tick: int) -> None:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return
        for task in tasks:
            text = _read_stat(f"/proc/{pid}/task/{task}/stat")
            if text is None:
                continue
            comm = text[text.index("(") + 1:text.rindex(")")]
            fields = text.rpartition(")")[2].split()
            self.threads[name][int(task)] = (comm, (int(fields[11]) + int(fields[12])) / tick)

    def by_thread(self, name: str) -> dict[str, float]:
        """CPU seconds of ``name``'s threads over its life, by thread name (digits dropped: the
        gRPC server's pool threads, say, are summed), largest first."""
        totals: dict[str, float] = {}
        for comm, cpu in self.threads.get(name, {}).values():
            key = comm.rstrip("0123456789_-") or comm
            totals[key] = totals.get(key, 0.0) + cpu
        return dict(sorted(((k, round(v, 2)) for k, v in totals.items() if v > 0), key=lambda kv: -kv[1]))

    def per_round(self, name: str, ends: list[float]) -> float:
        """Mean CPU seconds of ``name`` per round between consecutive round ends (round 2 on)."""
        samples = self.samples[name]

        def at(t: float) -> float:
            before = [cpu for stamp, cpu in samples if stamp <= t]
            return before[-1] if before else 0.0

        spans = [at(b) - at(a) for a, b in zip(ends, ends[1:])]
        return statistics.mean(spans) if spans else float("nan")


def _read_stat(path: str) -> str | None:
    """The text of a ``/proc`` stat file, or None if the process or thread is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode()
    except OSError:
        return None
    finally:
        os.close(fd)


def calls_per_round(audit: Path) -> float:
    """Mean number of calls the coordinator served a round, round 2 on: its ``served`` rows (or
    ``receive`` rows in a log written before one row a call) filed under that round, i.e. the
    calls that answered a job of that round (every call a site makes is one request the coordinator
    receives). By the jobs' round, not by the time between ``round`` rows: a round's first call
    is posted before the round before is recorded."""
    db = sqlite3.connect(f"{audit.absolute().as_uri()}?mode=ro", uri=True)
    try:
        counts = [n for (n,) in db.execute(
            "SELECT COUNT(*) FROM events WHERE action IN ('served', 'receive') AND round >= 2 "
            "AND round <= (SELECT MAX(round) FROM events WHERE action = 'round') GROUP BY round")]
    finally:
        db.close()
    return statistics.mean(counts) if counts else float("nan")


def round_ends(audit: Path) -> list[float]:
    """UTC times (epoch seconds) of the ``round`` rows of an audit log."""
    db = sqlite3.connect(f"{audit.absolute().as_uri()}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT time FROM events WHERE action = 'round' ORDER BY seq").fetchall()
    finally:
        db.close()
    return [dt.datetime.fromisoformat(t).timestamp() for (t,) in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--params", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--profile", type=Path, default=None,
                        help="write a cProfile (CPU time) of each site's main thread to DIR/site-K.prof")
    parser.add_argument("--timeline", type=Path, default=None,
                        help="record every exchange and job (benchmarks.timeline_process) in DIR and "
                             "report where a round's wall time goes, stage by stage")
    args = parser.parse_args()

    from fedsec.config import load_config
    from fedsec.experiment import run_experiment
    from fedsec.network import demo

    root = Path(tempfile.mkdtemp(prefix="fedsec-deploy-bench-"))
    try:
        model, features = shape_for(args.params)
        d = demo.prepare(root / "d", args.sites, rounds=args.rounds)
        files, columns = write_data(root, args.sites, features, args.rows)
        d.data[:] = files
        d.plan.write_text(plan([s.name for s in d.sites], columns, model, args.rounds))
        policy = root / "site.toml"
        policy.write_text("[dp]\nrequired = false\n[aggregation]\nmin_sites = 3\n")
        log(f"plan: {args.sites} sites, {model} with {features} features, {args.rounds} rounds")
        quoted = "[" + ",".join(f'"{p}"' for p in files) + "]"
        load_before = os.getloadavg()
        sampler = CpuSampler()
        sampler.watch("simulation", None)
        sampler.start()
        simulated = run_experiment(load_config(d.plan, [f"data.files={quoted}"]), out=root / "sim")
        sampler.stop()
        sim_cpu = sampler.per_round("simulation", round_ends(root / "sim" / "audit.db"))
        sim_sampler = sampler.own_cpu / max(sampler.own_wall, 1e-9)
        log("simulation done; starting the deployment")
        coordinator, port = _start_coordinator(d, root / "coordinator.log", args.timeline)
        commands = [_timed(_profiled(demo.join_command(d, k, port, policy=policy), args.profile, k),
                           args.timeline, f"site-{k}") for k in range(args.sites)]
        sites = [subprocess.Popen(commands[k],
                                  stdout=subprocess.DEVNULL, stderr=open(root / f"site-{k}.log", "w"))
                 for k in range(args.sites)]
        sampler = CpuSampler()
        sampler.watch("coordinator", coordinator.pid, threads=True)
        for k, p in enumerate(sites):
            sampler.watch(f"site-{k}", p.pid, threads=k == 0)
        sampler.start()
        try:
            coordinator.communicate(timeout=3000)
            for p in sites:
                p.wait(timeout=120)
        finally:
            sampler.stop()
            for p in [coordinator, *sites]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        deployed = json.loads((d.run_dir / "summary.json").read_text())
        sim_s, dep_s = median_seconds(root / "sim" / "history.csv"), median_seconds(d.run_dir / "history.csv")
        n_params = deployed["deployment"]
        wire = n_params["wire_bytes"]
        protocol = n_params["protocol_bytes"]
        model_bytes = 4 * _parameters(model, features)
        # an evaluation job per round carries the model, and round 1's training job; a later
        # training job names the model the site's last evaluation was of (its SHA-256)
        jobs = args.rounds + 1
        per_site = []
        for name, w in wire.items():
            p = protocol.get(name, {"from_site": 0, "to_site": 0})
            counted = p["from_site"] + p["to_site"] + jobs * model_bytes
            per_site.append((w["from_site"] + w["to_site"]) / counted)
        up = [wire[n]["from_site"] / max(1, protocol[n]["from_site"]) for n in protocol]
        ends = round_ends(d.run_dir / "audit.db")
        coordinator_cpu = sampler.per_round("coordinator", ends)
        site_cpu = [sampler.per_round(f"site-{k}", ends) for k in range(args.sites)]
        total_cpu = coordinator_cpu + sum(site_cpu)
        cores = os.cpu_count() or 1
        result = {
            "sites": args.sites, "params": _parameters(model, features), "model": model,
            "rounds": args.rounds,
            "simulated_round_seconds": round(sim_s, 4), "deployed_round_seconds": round(dep_s, 4),
            "deployed_over_simulated": round(dep_s / sim_s, 3),
            "wire_over_protocol": round(max(per_site), 4),
            "wire_over_protocol_upload": round(max(up), 4),
            "cpu_seconds_per_round": {
                "simulated": round(sim_cpu, 4), "coordinator": round(coordinator_cpu, 4),
                "site_mean": round(statistics.mean(site_cpu), 4), "sites_total": round(sum(site_cpu), 4),
                "deployed_total": round(total_cpu, 4)},
            "calls_per_round": round(calls_per_round(d.run_dir / "audit.db"), 1),
            "cpu_seconds_by_thread": {"coordinator": sampler.by_thread("coordinator"),
                                      "site-0": sampler.by_thread("site-0")},
            "cores": cores,
            "sampler_cpu_share": {"simulation": round(sim_sampler, 4),
                                  "deployment": round(sampler.own_cpu / max(sampler.own_wall, 1e-9), 4)},
            "cpu_floor_over_simulated": round(total_cpu / cores / sim_s, 3),
            "load_average": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
            "simulated_accuracy": simulated["final_accuracy"],
            "deployed_accuracy": deployed["final_accuracy"],
            **({"timeline": timeline(args.timeline, ends)} if args.timeline is not None else {}),
            "goal": "deployed_over_simulated <= 1.5 and wire_over_protocol <= 1.1 at 10 sites x 100k",
        }
        emit(result)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _profiled(command: list[str], folder: Path | None, k: int) -> list[str]:
    """``command`` (``python -m fedsec join ...``) run under cProfile (the main thread's CPU time)
    writing ``folder/site-K.prof``."""
    if folder is None:
        return command
    folder.mkdir(parents=True, exist_ok=True)
    python, flag, module, *rest = command
    assert (flag, module) == ("-m", "fedsec"), command
    out = str(folder.absolute() / f"site-{k}.prof")
    return [python, "-m", "benchmarks.profile_process", out, "fedsec", *rest]


def _timed(command: list[str], folder: Path | None, name: str) -> list[str]:
    """``command`` (``python -m fedsec ...``) run under :mod:`benchmarks.timeline_process`, writing
    ``folder/NAME.jsonl``."""
    if folder is None:
        return command
    folder.mkdir(parents=True, exist_ok=True)
    python, flag, module, *rest = command
    if (flag, module) != ("-m", "fedsec"):
        raise SystemExit("--timeline and --profile do not combine")
    return [python, "-m", "benchmarks.timeline_process", str(folder.absolute() / f"{name}.jsonl"), "fedsec",
            *rest]


def _start_coordinator(d, log: Path, folder: Path | None) -> tuple[subprocess.Popen, int]:
    """:func:`fedsec.network.demo.start_coordinator`, under the timeline recorder with ``folder``."""
    from fedsec.network import demo

    if folder is None:
        return demo.start_coordinator(d, log=log)
    return demo.start_coordinator(d, log=log, command=_timed(demo.serve_command(d), folder, "coordinator"))


def timeline(folder: Path, ends: list[float]) -> dict[str, object]:
    """Where a round's wall time went, stage by stage (rounds 2 on; means over rounds, ms).

    For each exchange of the coordinator, in the order of a round: ``wall`` (posted to returned),
    ``to_first``/``to_last`` (posted to the first/last answer's arrival), ``site_work`` (the
    slowest site's time in its job runner) and ``site_cpu`` (the sites' main-thread CPU in it,
    summed), ``pickup`` (posted to the last site starting it: delivery and wake-up), and
    ``before`` (the coordinator's own time from the previous exchange's return to this posting).
    A round's first call, posted at the end of the round before (``RemoteRound.prefetch``), is
    its round's: its ``wall`` holds the coordinator's work between the two rounds, done while the
    sites answer it.
    """
    coordinator = [json.loads(line) for line in open(folder / "coordinator.jsonl")]
    sites = [json.loads(line) for path in sorted(folder.glob("site-*.jsonl")) for line in open(path)]
    rounds: dict[int, list[dict]] = {}
    previous = None
    for record in sorted(coordinator, key=lambda r: r["posted"]):
        record["before"] = record["posted"] - previous if previous is not None else float("nan")
        previous = record["returned"]
        # by the round its jobs are of: a round's first call is posted at the end of the round before
        if isinstance(record["round"], int) and record["round"] >= 2:
            rounds.setdefault(record["round"], []).append(record)
    stages: list[dict[str, object]] = []
    for position in range(min((len(v) for v in rounds.values()), default=0)):
        rows = [v[position] for v in rounds.values()]
        mine = [[s for s in sites if r["posted"] <= s["start"] <= r["returned"]] for r in rows]

        def ms(values: list[float]) -> float:
            return round(1000 * statistics.mean(values), 1) if values else float("nan")

        stages.append({
            "what": rows[0]["what"],
            "wall": ms([r["returned"] - r["posted"] for r in rows]),
            "to_first": ms([r["answers"][0] - r["posted"] for r in rows if r["answers"]]),
            "to_last": ms([r["answers"][-1] - r["posted"] for r in rows if r["answers"]]),
            "pickup": ms([max(s["start"] for s in m) - r["posted"] for r, m in zip(rows, mine) if m]),
            "site_work": ms([max(s["end"] - s["start"] for s in m) for m in mine if m]),
            "site_cpu": ms([sum(s["thread_cpu"] for s in m) for m in mine if m]),
            "before": ms([r["before"] for r in rows]),
        })
    spans = [b - a for a, b in zip(ends, ends[1:])]
    return {"stages": stages, "exchanges_per_round": len(stages),
            "round_ms": round(1000 * statistics.mean(spans), 1) if spans else float("nan"),
            "in_exchanges_ms": round(sum(float(s["wall"]) for s in stages), 1),
            "coordinator_between_ms": round(sum(float(s["before"]) for s in stages), 1)}


def _parameters(model: str, features: int) -> int:
    return features + 1 if model == "logreg" else 200 * features + MLP_FIXED


if __name__ == "__main__":
    main()
