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
from fedsec.protocols.paillier.messages import Registration, encode

from fedsec.audit.log import read_events
from fedsec.cli import main as fedsec_main
from tests.fedsec.network.conftest import enrol
from tests.fedsec.network.keyholder_helpers import ROOT, keyholder_process
from tests.fedsec.test_csv_run import LABEL, write_shards

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_accountant_engines")]
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
    """``fedsec run`` on the same plan (in this process: the CSV shards are ``data.files``)."""
    assert fedsec_main(["run", str(plan), "--out", str(out), "--quiet"]) == 0
    return (out / "history.csv").read_text()


def assert_same_history(deployed: str, simulated: str, *, upload_tolerance: float = 0.0,
                        less: dict[tuple[int, str], int] | None = None) -> None:
    """Every column equal but ``seconds``; ``loss`` to 1e-6 relative: the federated loss sum is
    computed at the site (torch, another process) and can differ from the simulation's in its last
    bits, which moves the stochastic rounding of the 48-bit statistics encoding by a quantum
    (about 1e-7 of the sum); accuracy, epsilon, participants and upload are exact."""
    mine, theirs = list(csv.DictReader(deployed.splitlines())), list(csv.DictReader(simulated.splitlines()))
    assert len(mine) == len(theirs) and mine[0].keys() == theirs[0].keys()
    for a, b in zip(mine, theirs):
        for key in a:
            if key == "seconds":
                continue
            if key == "loss":
                assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-6)
            elif key.endswith("upload_bytes") and upload_tolerance:
                assert abs(int(a[key]) - int(b[key])) <= int(b[key]) * upload_tolerance
            elif (int(a["round"]), key) in (less or {}):
                assert int(a[key]) == int(b[key]) - less[(int(a["round"]), key)], (key, a[key], b[key])
            else:
                assert a[key] == b[key], (key, a[key], b[key])


def test_key_holder_custody_deployed_run_equals_the_simulation(study, deployment, tmp_path):
    root, columns = deployment
    with keyholder_process(study, tmp_path / "kh", threshold=3) as (keyholder, port):
        plan = write_plan(root, columns, "key_holder", f"127.0.0.1:{port}")
        states = {name: tmp_path / name for name in SITES}
        run_deployment(study, root, plan, tmp_path / "run", states)
        keyholder.terminate()
        assert keyholder.wait(timeout=20) == 0
    deployed = (tmp_path / "run" / "history.csv").read_text()
    # The simulation's evaluation runs its own protocol instance, with its own key holder, so its
    # first evaluation uploads the four registrations again; deployed sites registered once, with
    # the one key holder. Every other byte is equal.
    registration = len(encode(Registration(0, bytes(16), bytes(32), bytes(64), 1)))
    assert_same_history(deployed, simulated_history(plan, tmp_path / "sim"),
                        less={(1, "eval_upload_bytes"): 4 * registration})
    served = [e for e in read_events(tmp_path / "kh" / "audit.db") if e.action == "decrypt.served"]
    assert len(served) >= 2 and all(e.payload()["contributors"] == [0, 1, 2, 3] for e in served)
    assert [e.round for e in served] == list(range(1, len(served) + 1))
    logs = [str(tmp_path / "run" / "audit.db"), str(tmp_path / "kh" / "audit.db"),
            *(str(states[n] / "audit.db") for n in SITES)]
    assert fedsec_main(["audit", "reconcile", *logs, "--coordinator", "coordinator"]) == 0
    acks = [e for e in read_events(tmp_path / "run" / "audit.db") if e.action == "ack"
            and e.payload()["actor"] == "auditor"]
    assert len(acks) == len(served)  # the coordinator acknowledged the key holder's head each time


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
    # Proofs hold random integers of varying byte length: the upload may differ by a few bytes.
    simulated = simulated_history(plan, tmp_path / "sim")
    assert_same_history((tmp_path / "run" / "history.csv").read_text(), simulated, upload_tolerance=0.005)
    assert all((states[n] / "endorsements.db").exists() for n in SITES)
