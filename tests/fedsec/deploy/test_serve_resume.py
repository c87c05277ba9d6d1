"""kill -9 the deployed coordinator mid-round, then ``fedsec serve --resume`` (issue 14): four sites
and a coordinator as real processes, masking + DP-SGD + dp.reproducible. The resumed run's history
(every column but ``seconds``), model digest and epsilon are the uninterrupted run's (the simulation
of the same plan, which ``test_reproducible`` shows equal to the uninterrupted deployment).

"Mid-round" is made deterministic: once round 1's checkpoint is on disk the LAST site in client
order is stopped (SIGSTOP); under reproducible DP-SGD the sites train one after another in client
order, so round 2 waits on it. Once the first site's ``site.db`` records its round-2 training the
coordinator is killed; the test checks (not assumes) that the stopped site had not trained round 2.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from fedsec.audit.log import read_events
from fedsec.audit.verify import verify_log
from fedsec.config import load_config
from fedsec.experiment import run_experiment
from fedsec.network import demo
from tests.fedsec.deploy.harness import federation, site_db_has

pytestmark = pytest.mark.slow
EXTRA = "[dp]\nreproducible = true\naccountant = \"rdp\"\n"  # rdp: every process calibrates fast
ROUNDS = 3
WAIT = 120.0


def _until(check, what: str, timeout: float = WAIT):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(what)


def _checkpoint_round(root: Path) -> int:
    for path in root.glob(".run.*.tmp/checkpoint.npz"):
        try:
            with np.load(path, allow_pickle=False) as data:
                return int(json.loads(str(data["meta"]))["round"])
        except (OSError, ValueError, KeyError):
            return 0
    return 0


def _trained(state: Path, round_index: int) -> bool:
    return site_db_has(state, "SELECT 1 FROM contributions WHERE round = ?", (round_index,))


def _history(path: Path) -> list[dict[str, str]]:
    rows = list(csv.DictReader(open(path)))
    for row in rows:
        row.pop("seconds")
    return rows


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume") / "d"
    d = demo.prepare(root, 4, rounds=ROUNDS, extra=EXTRA, stage_timeout=30.0)
    policy = root / "site.toml"
    policy.write_text("[dp]\nrequired = false\n")  # dp.reproducible is refused by the default policy
    last = 3
    with federation(d) as running:
        for k in range(4):
            running.join(k, policy=policy)
        _until(lambda: _checkpoint_round(root) >= 1, "round 1's checkpoint")
        os.kill(running.sites[last].pid, signal.SIGSTOP)
        try:
            _until(lambda: _trained(d.state(0), 2), "site 0's round-2 training")
            running.coordinator.send_signal(signal.SIGKILL)
            running.coordinator.wait(timeout=30)
            checkpointed = _checkpoint_round(root)
            stopped_had_trained = _trained(d.state(last), 2)
        finally:
            os.kill(running.sites[last].pid, signal.SIGCONT)
        command = [*demo.serve_command(d, listen=f"127.0.0.1:{running.port}"), "--resume"]
        log = open(root / "resumed.log", "w")
        again = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        running.coordinator = again  # waited for and killed on the way out by the harness
        code, out = running.wait(timeout=WAIT)
        logs = [running.site_log(k) for k in range(4)]
    return d, checkpointed, stopped_had_trained, code, out, logs


def test_the_precondition_the_coordinator_died_mid_round_2(resumed):
    _, checkpointed, stopped_had_trained, _, _, _ = resumed
    assert checkpointed == 1
    assert not stopped_had_trained


def test_the_resumed_run_equals_the_uninterrupted_one(resumed, tmp_path):
    d, _, _, code, out, logs = resumed
    assert code == 0, (out, (d.root / "resumed.log").read_text())
    assert all("the run is over" in log for log in logs), logs
    files = "[" + ",".join(f'"{p}"' for p in d.data) + "]"
    summary = run_experiment(load_config(d.plan, [f"data.files={files}"]), out=tmp_path / "sim")
    deployed, simulated = _history(d.run_dir / "history.csv"), _history(tmp_path / "sim" / "history.csv")
    assert len(deployed) == len(simulated) == ROUNDS
    for mine, theirs in zip(deployed, simulated, strict=True):
        assert mine.keys() == theirs.keys()
        for key in mine:
            if key == "loss":  # float32 sums of the same records in another memory layout
                assert math.isclose(float(mine[key]), float(theirs[key]), rel_tol=1e-6), key
            elif key in ("epsilon", "epsilon_rdp", "budget_remaining"):
                # the PLD accountant's last digits depend on what the process computed before (a
                # resumed process composes afresh): equal to 1e-9, the same ledger
                assert math.isclose(float(mine[key]), float(theirs[key]), rel_tol=1e-9, abs_tol=1e-9), key
            else:
                assert mine[key] == theirs[key], (mine["round"], key, mine[key], theirs[key])
    ours = json.loads((d.run_dir / "summary.json").read_text())
    assert ours["model_sha256"] == summary["model_sha256"]
    assert math.isclose(ours["epsilon"], summary["epsilon"], rel_tol=1e-9)
    epsilons = [float(r["epsilon"]) for r in deployed]
    assert all(b > a for a, b in zip(epsilons, epsilons[1:]))  # continuous: never reset


def test_the_coordinators_log_continues_one_chain_and_each_site_trained_each_round_once(resumed):
    d = resumed[0]
    verify_log(d.run_dir / "audit.db")
    events = read_events(d.run_dir / "audit.db")
    resumed_events = [e for e in events if e.action == "resumed"]
    assert len(resumed_events) == 1 and resumed_events[0].payload()["checkpoint_round"] == 1
    released = sorted(e.round for e in events if e.action == "model_released")
    assert released == list(range(1, ROUNDS + 1))  # round 2 was lost before its release
    for k in range(4):
        verify_log(d.state(k) / "audit.db")
        db = sqlite3.connect(d.state(k) / "site.db")
        rounds = [r for (r,) in db.execute("SELECT round FROM contributions ORDER BY round")]
        consumed = [r for (r,) in db.execute("SELECT round FROM consumed WHERE kind = 'update' "
                                             "ORDER BY round")]
        db.close()
        assert rounds == consumed == list(range(1, ROUNDS + 1))
        site = read_events(d.state(k) / "audit.db")
        epsilons = {e.round: e.payload()["epsilon"] for e in site if e.action == "epsilon"}
        coordinator = {e.round: e.payload()["epsilon"] for e in events
                       if e.action == "epsilon" and e.payload().get("party") == d.sites[k].name}
        assert sorted(epsilons) == sorted(coordinator) == list(range(1, ROUNDS + 1))
        for r in epsilons:
            assert math.isclose(epsilons[r], coordinator[r], rel_tol=1e-9)
        contributions = [(e.round, e.payload()) for e in site if e.action == "contribution"]
        first = [r for r, p in contributions if not p.get("retrain")]
        assert first == list(range(1, ROUNDS + 1))
        assert all(p["count"] == r for r, p in contributions)
        if k == 0:  # it had trained round 2 when the coordinator died: it trained it again
            assert (2, {"count": 2, "retrain": True}) in contributions
