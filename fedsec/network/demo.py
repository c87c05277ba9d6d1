"""``fedsec demo deploy``: a real deployment on one machine, every party its own OS process.

It creates a study CA, enrols a coordinator and N hospitals (each makes its own keys; the CA signs
their requests), writes each hospital its own CSV shard of the breast-cancer data, writes the plan
(the default private experiment: masking and DP-SGD, with a ``[federation]`` section), then
starts ``fedsec serve`` and N ``fedsec join`` processes on 127.0.0.1 and waits for the run to end.
The same commands, with the addresses changed, run the parties on separate machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives import serialization

from fedsec.network import pki

LABEL = "diagnosis"


@dataclass(frozen=True)
class Enrolled:
    """A party's files: certificate, TLS key and identity key."""

    name: str
    cert: Path
    key: Path
    identity: Path


def enrol(ca_dir: Path, party_dir: Path, name: str, role: str, *, days: int = pki.DEFAULT_DAYS) -> Enrolled:
    """``fedsec site init`` then ``fedsec ca sign`` for one party."""
    pki.init_site(party_dir, name=name, role=role)
    signed = pki.sign_request(ca_dir, (party_dir / f"{name}.csr").read_bytes(), days=days)
    cert = party_dir / f"{name}.crt"
    cert.write_bytes(signed.certificate.public_bytes(serialization.Encoding.PEM))
    return Enrolled(name, cert, party_dir / f"{name}.key", party_dir / f"{name}.identity.key")


def feature_columns() -> list[str]:
    """The breast-cancer features as CSV column names (spaces replaced by underscores)."""
    from sklearn.datasets import load_breast_cancer

    return [n.replace(" ", "_") for n in load_breast_cancer().feature_names]


def breast_cancer_shards(folder: Path, n: int, *, seed: int = 0) -> list[Path]:
    """Write ``folder/site-K.csv`` for K < n: a shuffled, near-equal split of the 569 records
    (header: the 30 features and ``diagnosis``, 0 = malignant, 1 = benign)."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    order = np.random.default_rng(seed).permutation(len(bunch.target))
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    header = ",".join([*feature_columns(), LABEL])
    for k, part in enumerate(np.array_split(order, n)):
        rows = [",".join([*(f"{v:.6g}" for v in bunch.data[i]), str(int(bunch.target[i]))]) for i in part]
        path = folder / f"site-{k}.csv"
        path.write_text(header + "\n" + "\n".join(rows) + "\n")
        paths.append(path)
    return paths


def plan_text(sites: list[str], *, rounds: int = 30, seed: int = 0, extra: str = "",
              stage_timeout: float = 60.0, join_timeout: float = 120.0) -> str:
    """A deployment plan over the breast-cancer shards (``extra``: more TOML lines at the top)."""
    columns = ", ".join(f'"{c}"' for c in feature_columns())
    roster = ", ".join(f'"{s}"' for s in sites)
    return (f"seed = {seed}\nrounds = {rounds}\n{extra}\n"
            f"[data]\ndataset = \"csv\"\nclients = {len(sites)}\nlabel = \"{LABEL}\"\n"
            f"classes = [\"0\", \"1\"]\ncolumns = [{columns}]\n\n"
            f"[federation]\nsites = [{roster}]\nserver = \"coordinator\"\nmin_sites = 3\n"
            f"stage_timeout = {stage_timeout}\njoin_timeout = {join_timeout}\n")


@dataclass
class Deployment:
    """The files of a demo deployment under ``root``."""

    root: Path
    ca: Path
    coordinator: Enrolled
    sites: list[Enrolled]
    data: list[Path]
    plan: Path
    policies: list[Path]
    """Each site's ``SITE.toml``: ``aggregation.peers`` = the study's other sites (review S6-2)."""

    def state(self, k: int) -> Path:
        return self.root / "state" / self.sites[k].name

    @property
    def run_dir(self) -> Path:
        return self.root / "run"


def prepare(root: Path, n_sites: int, *, rounds: int = 30, seed: int = 0, extra: str = "",
            stage_timeout: float = 60.0) -> Deployment:
    """CA, enrolments, CSV shards and plan under ``root`` (new)."""
    root.mkdir(parents=True, exist_ok=True)
    ca_dir = root / "ca"
    pki.init_ca(ca_dir, name="fedsec demo study")
    coordinator = enrol(ca_dir, root / "parties" / "coordinator", "coordinator", "server")
    names = [f"hospital-{chr(ord('a') + k)}" if k < 26 else f"hospital-{k}" for k in range(n_sites)]
    sites = [enrol(ca_dir, root / "parties" / name, name, "site") for name in names]
    data = breast_cancer_shards(root / "data", n_sites, seed=seed)
    plan = root / "plan.toml"
    plan.write_text(plan_text(names, rounds=rounds, seed=seed, extra=extra, stage_timeout=stage_timeout))
    policies = []
    for name in names:
        policy = root / "parties" / name / "SITE.toml"
        peers = ", ".join(f'"{other}"' for other in names if other != name)
        policy.write_text(f"[aggregation]\npeers = [{peers}]\n")
        policies.append(policy)
    return Deployment(root, ca_dir / "ca.crt", coordinator, sites, data, plan, policies)


def fedsec_command() -> list[str]:
    return [sys.executable, "-m", "fedsec"]


def serve_command(d: Deployment, *, listen: str = "127.0.0.1:0") -> list[str]:
    c = d.coordinator
    return [*fedsec_command(), "serve", str(d.plan), "--ca", str(d.ca), "--cert", str(c.cert), "--key",
            str(c.key), "--listen", listen, "--out", str(d.run_dir)]


def join_command(d: Deployment, k: int, port: int, *, policy: Path | None = None) -> list[str]:
    s = d.sites[k]
    command = [*fedsec_command(), "join", f"127.0.0.1:{port}", "--ca", str(d.ca), "--cert", str(s.cert),
               "--key", str(s.key), "--data", str(d.data[k]), "--state", str(d.state(k))]
    return command + (["--policy", str(policy)] if policy is not None else [])


def start_coordinator(d: Deployment, *, log: Path, timeout: float = 60.0,
                      command: list[str] | None = None) -> tuple[subprocess.Popen, int]:
    """Start ``fedsec serve`` (or ``command``, a wrapper of it: the benchmark's timed run), its
    stderr into ``log``; returns the process and its port once it listens (within ``timeout``
    seconds, else the process is killed and RuntimeError names the log)."""
    handle = open(log, "w")
    process = subprocess.Popen(command or serve_command(d), stdout=subprocess.PIPE, stderr=handle, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    end = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < end:
        line = process.stdout.readline()
        if line.startswith("listening "):
            return process, int(line.split()[1])
        if not line and process.poll() is not None:
            break
    process.kill()
    raise RuntimeError(f"the coordinator did not start; see {log}")


def run_demo(root: Path, n_sites: int, *, rounds: int = 30, say=print) -> int:
    """The whole demo; returns the coordinator's exit code."""
    d = prepare(root, n_sites, rounds=rounds)
    logs = root / "logs"
    logs.mkdir()
    say(f"study CA {d.ca}; coordinator and {n_sites} hospitals enrolled under {root / 'parties'}")
    say(f"plan {d.plan}; each hospital's data: {root / 'data'}")
    coordinator, port = start_coordinator(d, log=logs / "coordinator.log")
    say(f"coordinator listening on 127.0.0.1:{port} (pid {coordinator.pid})")
    sites = []
    try:
        for k in range(n_sites):
            log = open(logs / f"{d.sites[k].name}.log", "w")
            sites.append(subprocess.Popen(join_command(d, k, port, policy=d.policies[k]), stdout=log,
                                          stderr=subprocess.STDOUT))
            say(f"{d.sites[k].name} joined from its own process (pid {sites[-1].pid})")
        assert coordinator.stdout is not None
        for line in coordinator.stdout:
            say(f"coordinator: {line.rstrip()}")
        code = coordinator.wait()
        for p in sites:
            p.wait(timeout=60)
    finally:
        for p in [coordinator, *sites]:
            if p.poll() is None:
                p.kill()
                p.wait()
    say(f"run directory: {d.run_dir} (history.csv, summary.json, model.pt, audit.db)")
    for k, s in enumerate(d.sites):
        say(f"{s.name}: state and audit log {d.state(k)} (audit.db, ledger.db, site.db); "
            f"log {logs / (s.name + '.log')}")
    paths = " ".join(str(p) for p in [d.run_dir / "audit.db",
                                      *(d.state(k) / "audit.db" for k in range(n_sites))])
    say(f"check every party's record: fedsec audit reconcile {paths} --coordinator coordinator")
    return code
