"""The next round's training speculated during the evaluation, with real processes: four
``fedsec join`` sites and ``fedsec serve`` on 127.0.0.1 (masking, no DP, so the training of round
r + 1 goes with the update's masked input in round r's evaluation unmask call).

A site killed (``kill -9``) once its round-2 update was consumed in that call, i.e. during round
1's evaluation, and started again: the run ends (exit 0); round 2 is summed (with the three others,
or all four when its masked input got out before the kill: its self-mask is then rebuilt from the
others' shares); the restarted site is back in round 3; no ``site.db`` consumes a (kind, round)
twice; every audit log verifies.
"""

from __future__ import annotations

import csv
import os
import signal

import pytest

from fedsec.audit.log import read_events
from fedsec.audit.verify import verify_log
from fedsec.network import demo
from tests.fedsec.deploy.harness import federation, site_db_has
from tests.fedsec.deploy.test_serve_resume import _until
from tests.review.test_cut_kill9_real_processes import _records

pytestmark = pytest.mark.slow
ROUNDS = 3
WAIT = 60.0
POLICY = "[dp]\nrequired = false\n[aggregation]\nmin_sites = 3\n"


def test_a_site_killed_after_its_training_went_ahead_and_restarted(tmp_path):
    d = demo.prepare(tmp_path / "d", 4, rounds=ROUNDS, extra='[dp]\nmode = "none"\n', stage_timeout=20.0)
    policy = tmp_path / "site.toml"
    policy.write_text(POLICY)
    with federation(d) as running:
        for k in range(4):
            running.join(k, policy=policy)
        _until(lambda: site_db_has(d.state(0), "SELECT 1 FROM consumed WHERE kind = 'update' AND round = 2"),
               "site 0's round-2 update consumed", WAIT)
        evaluated_1 = site_db_has(d.state(0),
                                  "SELECT 1 FROM consumed WHERE kind = 'evaluation' AND round = 1")
        os.kill(running.sites[0].pid, signal.SIGKILL)
        running.sites[0].wait(timeout=10)
        running.join(0, policy=policy)  # a second process over the same state folder
        code, out = running.wait(timeout=WAIT * 3)
        assert code == 0, out
    assert evaluated_1  # its round-2 update went after round 1's evaluation input, in the same round
    history = list(csv.DictReader(open(d.run_dir / "history.csv")))
    assert [int(r["round"]) for r in history] == list(range(1, ROUNDS + 1))
    assert history[0]["status"] == "ok" and history[0]["participants"] == "4"
    assert history[1]["status"] == "ok" and history[1]["participants"] in ("3", "4"), history[1]
    assert history[2]["status"] == "ok" and history[2]["participants"] == "4", history[2]
    verify_log(d.run_dir / "audit.db")
    for k in range(4):
        records = _records(d.state(k))
        assert len(records) == len(set(records)), (k, records)
        assert ("update", 2) in records and ("update", 3) in records, (k, records)
        verify_log(d.state(k) / "audit.db")
    # the restarted site's own log: its round-2 training (before the kill) and its round-3 one
    trained = [e.round for e in read_events(d.state(0) / "audit.db") if e.action == "contribution"]
    assert trained[:2] == [1, 2] and trained[-1] == 3, trained
