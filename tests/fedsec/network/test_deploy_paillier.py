"""Paillier deployed as real OS processes on 127.0.0.1: a coordinator (`fedsec serve`), four sites
(`fedsec join`) and, under key-holder custody, the key holder (`fedsec keyholder`); under
threshold custody the auditor's `fedsec deal` first. The run completes and its history equals
`fedsec run` on the same plan and seed (dp.reproducible)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedsec.audit.log import read_events
from tests.fedsec.network.conftest import enrol
from tests.fedsec.network.keyholder_helpers import ROOT, keyholder_process
from tests.fedsec.test_csv_run import LABEL, write_shards

pytestmark = pytest.mark.slow
SITES = ("hosp-a", "hosp-b", "hosp-x", "hosp-c")
RUN_TIMEOUT = 240


def fedsec(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedsec", *args]


@pytest.fixture(scope="module")
def deployment(study, tmp_path_factory):
    """Shards, certificates and a policy that admits a reproducible plan (a test, not a study)."""
    root = tmp_path_factory.mktemp("deploy")
    study.parties["hosp-c"] = enrol(study.ca_dir, root / "hosp-c", "hosp-c", "site")
    write_shards(root)
    with open(root / "site0.csv") as handle:
        columns = [c for c in next(csv.reader(handle)) if c != LABEL]
    (root / "site.toml").write_text("[dp]\nrequired = false\n")
    return root, columns


def write_plan(root: Path, columns: list[str], custody: str, keyholder: str = "") -> Path:
    files = ", ".join(f'"site{k}.csv"' for k in range(4))
    path = root / f"plan-{custody}.toml"
    path.write_text(f"""seed = 11
rounds = 2
[data]
dataset = "csv"
files = [{files}]
label = "{LABEL}"
classes = [0, 1]
columns = [{", ".join(f'"{c}"' for c in columns)}]
[train]
local_epochs = 1
[secure]
aggregation = "paillier"
custody = "{custody}"
[dp]
mode = "dpsgd"
reproducible = true
[federation]
sites = [{", ".join(f'"{s}"' for s in SITES)}]
min_sites = 4
stage_timeout = 60
join_timeout = 120
keyholder = "{keyholder}"
""")
    return path


def run_deployment(study, root: Path, plan: Path, out: Path, states: dict[str, Path]) -> None:
    """Start the coordinator and the four sites; wait for all to exit 0; always kill on the way out."""
    coordinator = study.parties["coordinator"]
    ca = str(study.ca_dir / "ca.crt")
    processes = []
    try:
        serve = subprocess.Popen(fedsec("serve", str(plan), "--ca", ca, "--cert", str(coordinator.cert),
                                        "--key", str(coordinator.key), "--listen", "127.0.0.1:0", "--out",
                                        str(out)),
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        processes.append(serve)
        line = serve.stdout.readline()
        assert line.startswith("listening "), line + serve.stderr.read()
        port = int(line.split()[1])
        for k, name in enumerate(SITES):
            party = study.parties[name]
            processes.append(subprocess.Popen(
                fedsec("join", f"127.0.0.1:{port}", "--ca", ca, "--cert", str(party.cert), "--key",
                       str(party.key), "--data", str(root / f"site{k}.csv"), "--policy",
                       str(root / "site.toml"), "--state", str(states[name])),
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [p.communicate(timeout=RUN_TIMEOUT) for p in processes]
        for process, (stdout, stderr) in zip(processes, outputs):
            assert process.returncode == 0, f"{process.args[3:5]} exited {process.returncode}:\n{stderr}"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


def simulated_history(plan: Path, out: Path) -> str:
    run = subprocess.run(fedsec("run", str(plan), "--out", str(out), "--quiet"), cwd=ROOT,
                         capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert run.returncode == 0, run.stderr
    return (out / "history.csv").read_text()


def without_seconds(history: str) -> list[list[str]]:
    rows = list(csv.reader(history.splitlines()))
    drop = rows[0].index("seconds")
    return [[cell for i, cell in enumerate(row) if i != drop] for row in rows]


def test_key_holder_custody_deployed_run_equals_the_simulation(study, deployment, tmp_path):
    root, columns = deployment
    with keyholder_process(study, tmp_path / "kh", threshold=3) as (keyholder, port):
        plan = write_plan(root, columns, "key_holder", f"127.0.0.1:{port}")
        states = {name: tmp_path / name for name in SITES}
        run_deployment(study, root, plan, tmp_path / "run", states)
        keyholder.terminate()
        assert keyholder.wait(timeout=20) == 0
    deployed = (tmp_path / "run" / "history.csv").read_text()
    assert without_seconds(deployed) == without_seconds(simulated_history(plan, tmp_path / "sim"))
    served = [e for e in read_events(tmp_path / "kh" / "audit.db") if e.action == "decrypt.served"]
    assert len(served) >= 2 and all(e.payload()["contributors"] == [0, 1, 2, 3] for e in served)
    assert [e.round for e in served] == list(range(1, len(served) + 1))


def test_threshold_custody_deployed_run_equals_the_simulation(study, deployment, tmp_path):
    root, columns = deployment
    plan = write_plan(root, columns, "threshold")
    auditor = study.parties["auditor"]
    identity = auditor.key.with_name("auditor.identity.key")
    dealt = subprocess.run(fedsec("deal", str(plan), "--ca", str(study.ca_dir / "ca.crt"), "--cert",
                                  str(auditor.cert), "--identity", str(identity),
                                  "--out", str(tmp_path / "dealing"), "--sites",
                                  *[str(study.parties[n].cert) for n in SITES]),
                           cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert dealt.returncode == 0, dealt.stderr
    states = {}
    for name in SITES:
        states[name] = tmp_path / name
        states[name].mkdir()
        shutil.copy2(tmp_path / "dealing" / f"{name}.share", states[name] / "paillier.share")
        assert os.stat(states[name] / "paillier.share").st_mode & 0o777 == 0o600
    run_deployment(study, root, plan, tmp_path / "run", states)
    deployed = without_seconds((tmp_path / "run" / "history.csv").read_text())
    simulated = without_seconds(simulated_history(plan, tmp_path / "sim"))
    upload = deployed[0].index("upload_bytes")
    # Proofs hold random integers of varying byte length: the upload may differ by a few bytes.
    for mine, theirs in zip(deployed[1:], simulated[1:], strict=True):
        assert mine[:upload] + mine[upload + 1:] == theirs[:upload] + theirs[upload + 1:]
        assert abs(int(mine[upload]) - int(theirs[upload])) <= int(theirs[upload]) // 200
    assert deployed[0] == simulated[0]
    assert all((states[n] / "endorsements.db").exists() for n in SITES)
