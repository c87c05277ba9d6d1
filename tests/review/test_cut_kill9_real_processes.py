"""Review 8b, item 2: ``kill -9`` between the barrier cut's calls 2 and 6 (after round 2's update was
consumed at a site's setup, the evaluation's session opened ahead at every site, before the
evaluation's masked input), with real processes: four ``fedsec join`` sites and ``fedsec serve``
(masking + DP-SGD, RDP accountant; no ``dp.reproducible``, so the cut runs).

(1) A site killed there and started again: the run goes on; round 2 completes (with the three others,
or with all four when its masked input got out before the kill: since session 10 its update is
consumed in the call that answers it), the restarted site is back in round 3, no
site's ``site.db`` consumes a (kind, round) twice, and each site's epsilon events never decrease.
(2) The coordinator killed there and ``fedsec serve --resume`` started: the run ends (exit 0), round 2
is lost (every site's update of it went into the dead coordinator's setup: documented), rounds 1 and
3 are whole, epsilon never resets, no contribution is consumed twice, both audit logs verify.
"""

from __future__ import annotations

import csv
import os
import signal
import sqlite3
import subprocess
from contextlib import contextmanager

import pytest

from fedsec.audit.log import read_events
from fedsec.audit.verify import verify_log
from fedsec.network import demo
from tests.fedsec.deploy.harness import federation, site_db_has
from tests.fedsec.deploy.test_serve_resume import _checkpoint_round, _until

pytestmark = pytest.mark.slow
EXTRA = "[dp]\naccountant = \"rdp\"\n"
ROUNDS = 3
WAIT = 60.0


def _consumed(state, kind: str, round_index: int) -> bool:  # type: ignore[no-untyped-def]
    return site_db_has(state, "SELECT 1 FROM consumed WHERE kind = ? AND round = ?", (kind, round_index))


def _records(state) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    db = sqlite3.connect(state / "site.db")
    try:
        return db.execute("SELECT kind, round FROM consumed ORDER BY kind, round").fetchall()
    finally:
        db.close()


def _epsilons(path) -> list[float]:  # type: ignore[no-untyped-def]
    return [float(e.payload()["epsilon"]) for e in read_events(path) if e.action == "epsilon"]


def _checks(d, history: list[dict[str, str]]) -> None:  # type: ignore[no-untyped-def]
    assert [int(r["round"]) for r in history] == list(range(1, ROUNDS + 1))
    epsilons = [float(r["epsilon"]) for r in history]
    assert all(b >= a for a, b in zip(epsilons, epsilons[1:])), epsilons
    verify_log(d.run_dir / "audit.db")
    for k in range(4):
        records = _records(d.state(k))
        assert len(records) == len(set(records)), (k, records)
        verify_log(d.state(k) / "audit.db")
        mine = _epsilons(d.state(k) / "audit.db")
        assert all(b >= a for a, b in zip(mine, mine[1:])), (k, mine)


@contextmanager
def past_round_1(d):  # type: ignore[no-untyped-def]
    """The four sites and the coordinator of ``d`` running, once round 1's checkpoint is written."""
    with federation(d) as running:
        for k in range(4):
            running.join(k)
        _until(lambda: _checkpoint_round(d.root) >= 1, "round 1's checkpoint", WAIT)
        yield running


def test_a_site_killed_between_calls_2_and_6_and_restarted(tmp_path):
    d = demo.prepare(tmp_path / "d", 4, rounds=ROUNDS, extra=EXTRA, stage_timeout=20.0)
    with past_round_1(d) as running:
        _until(lambda: _consumed(d.state(0), "update", 2), "site 0's round-2 setup", WAIT)
        os.kill(running.sites[0].pid, signal.SIGKILL)
        running.sites[0].wait(timeout=10)
        evaluated_before = _consumed(d.state(0), "evaluation", 2)
        running.join(0)  # a second process over the same state folder
        code, out = running.wait(timeout=WAIT * 2)
        assert code == 0, out
    assert not evaluated_before
    history = list(csv.DictReader(open(d.run_dir / "history.csv")))
    _checks(d, history)
    # since the update's keys are agreed during the round before (session 10), a site's round-2
    # update is consumed in the call that returns its masked input: killed after that, it is in
    # round 2's sum if that answer got out (its self-mask rebuilt from the others' shares), not
    # if it did not
    assert history[1]["status"] == "ok" and history[1]["participants"] in ("3", "4"), history[1]
    assert history[2]["participants"] == "4"  # the restarted site is back
    assert ("update", 2) in _records(d.state(0))


def test_the_coordinator_killed_between_calls_2_and_6_then_resumed(tmp_path):
    d = demo.prepare(tmp_path / "d", 4, rounds=ROUNDS, extra=EXTRA, stage_timeout=20.0)
    with past_round_1(d) as running:
        os.kill(running.sites[3].pid, signal.SIGSTOP)  # holds round 2 in its first calls
        try:
            _until(lambda: _consumed(d.state(0), "update", 2), "site 0's round-2 setup", WAIT)
            running.coordinator.send_signal(signal.SIGKILL)
            running.coordinator.wait(timeout=30)
            checkpointed = _checkpoint_round(d.root)
        finally:
            os.kill(running.sites[3].pid, signal.SIGCONT)
        command = [*demo.serve_command(d, listen=f"127.0.0.1:{running.port}"), "--resume"]
        again = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=open(d.root / "resumed.log", "w"),
                                 text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        running.coordinator = again
        code, out = running.wait(timeout=WAIT * 2)
        assert code == 0, (out, (d.root / "resumed.log").read_text())
    assert checkpointed == 1
    history = list(csv.DictReader(open(d.run_dir / "history.csv")))
    _checks(d, history)
    assert history[0]["status"] == "ok" and history[2]["status"] == "ok"
    assert history[2]["participants"] == "4"
    events = read_events(d.run_dir / "audit.db")
    assert [e.payload()["checkpoint_round"] for e in events if e.action == "resumed"] == [1]
    released = {e.round: e.payload()["sha256"] for e in events if e.action == "model_released"}
    assert sorted(released) == [1, 2, 3]
    assert history[1]["status"].startswith("aborted") and history[1]["participants"] == "0", history[1]
    assert released[2] == released[1]  # the lost round released the same model again
