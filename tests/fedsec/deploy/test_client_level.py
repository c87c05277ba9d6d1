"""Client-level DP deployed: a coordinator and three sites as real processes (gRPC + mTLS on
127.0.0.1), masking with ``dp.mode = "client"`` and ``dp.reproducible``: the deployed history is
``fedsec run``'s for the same plan, and each site's own ledger and audit log hold its
client-level epsilon."""

from __future__ import annotations

import csv
import json
import math

import pytest

from fedsec.audit.log import read_events
from fedsec.config import load_config
from fedsec.experiment import run_experiment
from fedsec.network import demo
from fedsec.network.ledger import EpsilonLedger
from tests.fedsec.deploy.harness import federation

pytestmark = pytest.mark.slow
SITES = 3
EXTRA = '[dp]\nmode = "client"\nreproducible = true\ntarget_epsilon = 3.0\n'


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy-cdp") / "d"
    d = demo.prepare(root, SITES, rounds=2, extra=EXTRA, stage_timeout=30.0)
    policy = root / "site.toml"
    peers = ", ".join(f'"hospital-{chr(ord("a") + k)}"' for k in range(SITES))  # the study (itself included)
    policy.write_text(f"[aggregation]\npeers = [{peers}]\n"
                      "[dp]\nrequired = false\nmax_epsilon_run = 3.0\n")  # reproducible: not by default
    with federation(d) as running:
        for k in range(SITES):
            running.join(k, policy=policy)
        code, out = running.wait()
        logs = [running.site_log(k) for k in range(SITES)]
    return d, code, out, logs


def test_deployed_client_level_history_equals_the_simulation(run, tmp_path):
    d, code, out, logs = run
    assert code == 0, out
    assert all("the run is over" in log for log in logs), logs
    files = "[" + ",".join(f'"{p}"' for p in d.data) + "]"
    summary = run_experiment(load_config(d.plan, [f"data.files={files}"]), out=tmp_path / "sim")
    deployed = list(csv.DictReader(open(d.run_dir / "history.csv")))
    simulated = list(csv.DictReader(open(tmp_path / "sim" / "history.csv")))
    assert len(deployed) == len(simulated) == 2
    for mine, theirs in zip(deployed, simulated, strict=True):
        assert mine.keys() == theirs.keys()
        for key in mine:
            if key == "seconds":
                continue
            if key == "loss":  # float32 sums of the same records in another memory layout
                assert math.isclose(float(mine[key]), float(theirs[key]), rel_tol=1e-6), key
            else:
                assert mine[key] == theirs[key], (mine["round"], key, mine[key], theirs[key])
        assert mine["privacy_unit"] == "client" and int(mine["participants"]) == SITES
    ours = json.loads((d.run_dir / "summary.json").read_text())
    assert ours["model_sha256"] == summary["model_sha256"]
    assert ours["epsilon"] == summary["epsilon"] <= 3.0


def test_each_site_charges_its_own_client_level_epsilon(run):
    d, code, out, _ = run
    assert code == 0, out
    final = json.loads((d.run_dir / "summary.json").read_text())["epsilon"]
    for k in range(SITES):
        with EpsilonLedger(d.state(k), lifetime_cap=30.0) as ledger:
            assert ledger.spent_by_unit() == {"client": 3.0}
        charged = [e.payload()["epsilon"] for e in read_events(d.state(k) / "audit.db")
                   if e.action == "epsilon"]
        assert len(charged) == 2 and charged[0] < charged[1]
        assert charged[-1] == pytest.approx(final, rel=1e-9)  # every site took part in every round
