"""Private runs end to end: the hospital example, the budget stop, client-level DP, sweeps."""

from __future__ import annotations

import csv
import json

import pytest

from fedsec.cli import main
from fedsec.config import make_config
from fedsec.errors import ConfigError


def _rows(path):
    with open(path / "history.csv") as handle:
        return list(csv.DictReader(handle))


def test_the_default_run_is_the_private_hospital_example(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--out", str(out), "--quiet", "--set", "dp.reproducible=true"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    privacy = summary["privacy"]
    assert summary["rounds_run"] == 30 and summary["final_accuracy"] >= 0.93
    assert privacy["unit"] == "example" and privacy["epsilon"] <= 3.0
    assert summary["epsilon"] == privacy["epsilon"] and summary["delta"] == 1e-5
    rows = _rows(out)
    assert all(float(r["epsilon"]) <= 3.0 for r in rows)
    assert [float(r["epsilon"]) for r in rows] == sorted(float(r["epsilon"]) for r in rows)
    assert {"epsilon_rdp", "noise_multiplier", "sample_rate", "steps", "budget_remaining",
            "privacy_unit", "secagg_threshold"} <= set(rows[0])
    assert (out / "epsilon.png").is_file()
    assert json.loads(capsys.readouterr().out)["epsilon"] == privacy["epsilon"]


def test_fixed_noise_and_a_small_target_stop_early_and_never_overshoot(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--out", str(out), "--quiet", "--set", "secure.aggregation=none",
                 "--set", "dp.noise_multiplier=3", "--set", "dp.target_epsilon=1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "privacy_budget" and 0 < summary["rounds_run"] < 30
    assert all(float(r["epsilon"]) <= 1.0 for r in _rows(out))
    assert "privacy budget: round" in capsys.readouterr().err


@pytest.mark.parametrize("aggregation", ["none", "masking", "paillier"])
def test_client_level_runs_report_the_client_unit(tmp_path, aggregation):
    out = tmp_path / aggregation
    assert main(["run", "--out", str(out), "--quiet", "--set", "dp.mode=client",
                 "--set", f"secure.aggregation={aggregation}", "--set", "rounds=4",
                 "--set", "data.clients=6", "--set", "dp.target_epsilon=8"]) == 0
    privacy = json.loads((out / "summary.json").read_text())["privacy"]
    assert privacy["unit"] == "client" and 7.0 < privacy["epsilon"] <= 8.0
    if aggregation != "none":  # distributed Skellam noise: accounted by its RDP bound
        assert privacy["epsilon"] == privacy["epsilon_rdp"]


def test_client_level_configuration_checks():
    with pytest.raises(ConfigError, match="train.fraction"):
        make_config({"dp.mode": "client", "train.fraction": 0.5})
    with pytest.raises(ConfigError, match="secure.clip"):
        make_config({"dp.mode": "client", "secure.clip": 0.5, "dp.max_grad_norm": 1.0})
    with pytest.raises(ConfigError, match="dp.accountant: needs dp.mode"):
        make_config({"dp.mode": "none", "dp.accountant": "rdp"})


def test_sweep_writes_csv_and_plot(tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", "--out", str(out), "--quiet", "--epsilons", "1,4", "--seeds", "0",
                 "--set", "rounds=3", "--set", "secure.aggregation=none"]) == 0
    with open(out / "sweep.csv") as handle:
        rows = list(csv.DictReader(handle))
    baseline, rows = rows[:1], rows[1:]
    assert baseline[0]["dp_mode"] == "none" and baseline[0]["epsilon"] == ""
    assert 0.5 < float(baseline[0]["final_accuracy"]) <= 1.0 and baseline[0]["rounds_run"] == "3"
    assert [float(r["target_epsilon"]) for r in rows] == [1.0, 4.0]
    assert all(r["dp_mode"] == "dpsgd" for r in rows)
    assert all(float(r["epsilon"]) <= float(r["target_epsilon"]) for r in rows)
    assert float(rows[0]["noise_multiplier"]) > float(rows[1]["noise_multiplier"])
    assert (out / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_refuses_a_non_private_configuration(tmp_path, capsys):
    assert main(["sweep", "--out", str(tmp_path / "s"), "--quiet", "--set", "dp.mode=none"]) == 2
    assert "dp.mode: a sweep needs" in capsys.readouterr().err
    assert main(["sweep", "--out", str(tmp_path / "s"), "--quiet", "--epsilons", "x"]) == 2
