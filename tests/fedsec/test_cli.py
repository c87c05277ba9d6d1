import csv
import hashlib
import json
import subprocess
import sys

import pytest
import torch
from fedsec.fl_core.history import HISTORY_COLUMNS

from fedsec.cli import main
from fedsec.config import load_config
from fedsec.experiment import LOOP_FILES, RUN_FILES, build_experiment

FAST = ["--set", "rounds=3", "--quiet"]
PLAIN = ["--set", "secure.aggregation=none", "--set", "dp.mode=none"]
NO_DP = ["--set", "dp.mode=none"]


def _history(path):
    with open(path / "history.csv") as handle:
        return list(csv.DictReader(handle))


def test_run_writes_the_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST]) == 0
    assert all((out / name).is_file() for name in (*RUN_FILES, *LOOP_FILES))
    rows = _history(out)
    assert [int(r["round"]) for r in rows] == [1, 2, 3]
    header = list(rows[0])
    assert [c for c in header if c in HISTORY_COLUMNS] == list(HISTORY_COLUMNS)
    assert header.index("epsilon_rdp") == header.index("epsilon") + 1
    assert set(header[: len(HISTORY_COLUMNS) + 1]) == {*HISTORY_COLUMNS, "epsilon_rdp"}
    summary = json.loads((out / "summary.json").read_text())
    assert {"final_accuracy", "best_accuracy", "rounds_run", "rounds_to_target", "epsilon", "delta",
            "wall_seconds", "config_sha256", "versions"} <= set(summary)
    assert summary["rounds_run"] == 3 and summary["final_accuracy"] == float(rows[-1]["accuracy"])
    assert summary["model_sha256"] == hashlib.sha256((out / "model.pt").read_bytes()).hexdigest()
    assert set(torch.load(out / "model.pt")) == set(build_experiment(load_config(
        str(out / "config.toml"), [])).server.model.state_dict())
    assert summary["audit"]["events"] == 1 + 2 * 3 + 2  # start; round and epsilon x3; end, saved
    assert (out / "config.toml").read_text().startswith("seed = 0\nrounds = 3\n")
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["rounds_run"] == 3


def test_same_seed_same_history(tmp_path):
    runs = []
    for name in ("a", "b"):
        main(["run", "--out", str(tmp_path / name), "--set", "train.fraction=0.5",
              "--set", "data.clients=8", "--set", "dp.reproducible=true", *FAST])
        runs.append([{k: v for k, v in r.items() if k != "seconds"} for r in _history(tmp_path / name)])
    assert runs[0] == runs[1]


def test_config_file_and_target_accuracy(tmp_path):
    config = tmp_path / "exp.toml"
    config.write_text('rounds = 40\n[train]\ntarget_accuracy = 0.95\n[data]\npartition = "dirichlet"\n'
                      '[dp]\nmode = "none"\n[secure]\naggregation = "none"\n')
    assert main(["run", str(config), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["stop_reason"] == "target_accuracy"
    assert summary["rounds_to_target"] == summary["rounds_run"] < 40


@pytest.mark.parametrize("args", [
    ["--set", "nope=1"], ["--set", "data.clients=100000"], ["--set", "train.lr=-3"],
    ["--set", "secure.aggregation=paillier", "--set", "secure.key_bits=1024"],
    ["/nonexistent/exp.toml"],
])
def test_bad_config_exits_2_and_writes_nothing(tmp_path, capsys, args):
    out = tmp_path / "run"
    assert main(["run", *args, "--out", str(out), "--quiet"]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsec: error: ") and "\n" not in err


def test_python_dash_m_fedsec(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fedsec", "run", "--set", "data.dataset=bogus"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "data.dataset: must be one of" in done.stderr


@pytest.mark.parametrize("overrides", [
    ["data.dataset=synthetic", "data.setup=1"], ["data.dataset=synthetic", "data.setup=2"],
    ["data.dataset=synthetic", "data.setup=3"], ["data.dataset=synthetic", "data.setup=4"],
    ["data.dataset=digits", "model.name=cnn", "data.clients=10", "data.partition=shards"],
    ["data.dataset=digits", "model.name=mlp", "train.algorithm=fedsgd", "train.lr=0.5"],
    ["data.partition=unbalanced"], ["data.partition=feature_bias"],
])
def test_datasets_models_and_partitions_run(tmp_path, overrides):
    args = [a for o in overrides for a in ("--set", o)]
    assert main(["run", "--out", str(tmp_path / "r"), "--set", "rounds=2", "--quiet", *PLAIN,
                 *args]) == 0
    rows = _history(tmp_path / "r")
    assert len(rows) == 2 and all(0.0 <= float(r["accuracy"]) <= 1.0 for r in rows)


def test_masking_run_matches_plain_accuracy_and_records_the_protocol(tmp_path):
    common = ["--set", "rounds=15", "--set", "data.clients=6", "--quiet", *NO_DP]
    assert main(["run", "--out", str(tmp_path / "plain"), *common, *PLAIN]) == 0
    assert main(["run", "--out", str(tmp_path / "masked"), "--set", "secure.aggregation=masking",
                 "--set", "secure.dropout=0.2", "--set", "secure.active=true", *common]) == 0
    plain = json.loads((tmp_path / "plain" / "summary.json").read_text())
    masked = json.loads((tmp_path / "masked" / "summary.json").read_text())
    assert masked["final_accuracy"] >= plain["final_accuracy"] - 0.02
    rows = _history(tmp_path / "masked")
    assert {"clipped", "client_aborts", "secagg_degree", "secagg_threshold"} <= set(rows[0])
    assert sum(int(r["dropped"]) for r in rows) > 0
    assert all(int(r["participants"]) + int(r["dropped"]) == 6 for r in rows)
    assert int(rows[0]["upload_bytes"]) > int(_history(tmp_path / "plain")[0]["upload_bytes"])


@pytest.mark.parametrize("custody", ["key_holder", "threshold"])
def test_paillier_run_matches_plain_accuracy(tmp_path, custody):
    common = ["--set", "rounds=15", "--set", "data.clients=6", "--quiet", *NO_DP]
    assert main(["run", "--out", str(tmp_path / "plain"), *common, *PLAIN]) == 0
    assert main(["run", "--out", str(tmp_path / "he"), "--set", "secure.aggregation=paillier",
                 "--set", f"secure.custody={custody}", "--set", "secure.dropout=0.2", *common]) == 0
    plain = json.loads((tmp_path / "plain" / "summary.json").read_text())
    he = json.loads((tmp_path / "he" / "summary.json").read_text())
    assert he["final_accuracy"] >= plain["final_accuracy"] - 0.02
    rows = _history(tmp_path / "he")
    assert {"clipped", "contributions", "rejected"} <= set(rows[0])
    assert sum(int(r["dropped"]) for r in rows) > 0
    assert all(r["status"] == "ok" or r["status"].startswith("aborted") for r in rows)
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(float(r["contributions"]) == int(r["participants"]) >= 4 for r in ok)
