"""``fedsec demo deploy``: a CA, a coordinator and three hospitals as OS processes, to the end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedsec.audit.reconcile import reconcile_paths

pytestmark = pytest.mark.slow


def test_demo_deploy_runs_the_private_experiment_and_says_where_everything_is(tmp_path):
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "fedsec", "demo", "deploy", "--sites", "3", "--rounds", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["rounds_run"] == 2 and summary["epsilon"] > 0
    assert summary["deployment"]["sites"] == ["hospital-a", "hospital-b", "hospital-c"]
    assert f"run directory: {out / 'run'}" in done.stdout
    names = summary["deployment"]["sites"]
    logs = [out / "run" / "audit.db", *(out / "state" / n / "audit.db" for n in names)]
    for name in summary["deployment"]["sites"]:
        assert f"{name}: state and audit log {out / 'state' / name}" in done.stdout
        assert (out / "state" / name / "ledger.db").exists()
    assert reconcile_paths(logs, coordinator="coordinator") == []
    assert "fedsec audit reconcile" in done.stdout


def test_demo_deploy_refuses_too_few_sites(tmp_path, capsys):
    from fedsec.cli import main

    assert main(["demo", "deploy", "--sites", "2", "--out", str(tmp_path / "x")]) == 2
    assert "--sites" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
