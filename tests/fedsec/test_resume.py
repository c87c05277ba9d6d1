"""Checkpoints, --resume after kill -9, Ctrl-C in run and sweep: real ``fedsec`` subprocesses."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedsec.audit.log import read_events
from fedsec.audit.verify import verify_log
from fedsec.checkpoint import check_resumable, read_checkpoint
from fedsec.config import make_config
from fedsec.errors import ConfigError
from fedsec.experiment import resume_experiment, run_experiment

FEDSEC = [sys.executable, "-m", "fedsec"]
ROUNDS = 6
REPRODUCIBLE = ["--quiet", "--set", f"rounds={ROUNDS}", "--set", "dp.reproducible=true"]


def _wait(check, process: subprocess.Popen, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    """Poll ``check()`` until it returns a value (fails if the process ends first)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        assert process.poll() is None, "the run ended before the signal"
        time.sleep(0.01)
    raise AssertionError("timed out")


def _checkpoint_round(parent: Path, name: str) -> int:
    for path in parent.glob(f".{name}.*.tmp/checkpoint.npz"):
        try:
            with np.load(path, allow_pickle=False) as data:
                return int(json.loads(str(data["meta"]))["round"])
        except (OSError, ValueError, KeyError):
            return 0
    return 0


def _history(folder: Path) -> list[dict[str, str]]:
    rows = list(csv.DictReader(open(folder / "history.csv")))
    for row in rows:
        row.pop("seconds")
    return rows


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    """kill -9 after round k (dp.reproducible, masking, DP-SGD): same model, history, epsilon."""
    subprocess.run([*FEDSEC, "run", "--out", str(tmp_path / "full"), *REPRODUCIBLE], check=True,
                   capture_output=True)
    process = subprocess.Popen([*FEDSEC, "run", "--out", str(tmp_path / "cut"), *REPRODUCIBLE],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_after = _wait(lambda: _checkpoint_round(tmp_path, "cut") >= 2 and
                         _checkpoint_round(tmp_path, "cut"), process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "cut").exists() and killed_after < ROUNDS
    done = subprocess.run([*FEDSEC, "run", "--resume", str(tmp_path / "cut"), "--quiet"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert cut["model_sha256"] == full["model_sha256"]
    assert cut["privacy"]["epsilon"] == full["privacy"]["epsilon"]
    assert cut["rounds_run"] == ROUNDS and cut["config_sha256"] == full["config_sha256"]
    assert _history(tmp_path / "cut") == _history(tmp_path / "full")
    epsilons = [float(r["epsilon"]) for r in _history(tmp_path / "cut")]
    assert all(b > a for a, b in zip(epsilons, epsilons[1:]))  # continuous: never reset
    assert verify_log(tmp_path / "cut" / "audit.db").events == cut["audit"]["events"]
    events = read_events(tmp_path / "cut" / "audit.db")
    resumed = [e for e in events if e.action == "resume"]
    assert len(resumed) >= 1 and resumed[-1].payload()["from_round"] <= killed_after + 1
    digests = {e.round: e.payload()["model_sha256"] for e in read_events(tmp_path / "full" / "audit.db")
               if e.action == "round"}
    logged = [(e.round, e.payload()["model_sha256"]) for e in events if e.action == "round"]
    assert sorted({r for r, _ in logged}) == list(range(1, ROUNDS + 1))
    assert all(digest == digests[r] for r, digest in logged)  # a round logged twice: the same model


def test_ctrl_c_ends_a_run_as_interrupted_with_its_files(tmp_path: Path) -> None:
    process = subprocess.Popen([*FEDSEC, "run", "--quiet", "--out", str(tmp_path / "run"),
                                "--set", "rounds=500"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    _wait(lambda: _checkpoint_round(tmp_path, "run") >= 2, process)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert json.loads(out.strip().splitlines()[-1])["stop_reason"] == "interrupted"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and 2 <= summary["rounds_run"] < 500
    assert (tmp_path / "run" / "accuracy.png").is_file() and (tmp_path / "run" / "epsilon.png").is_file()
    assert len(_history(tmp_path / "run")) == summary["rounds_run"]
    assert verify_log(tmp_path / "run" / "audit.db").events == summary["audit"]["events"]
    end = [e for e in read_events(tmp_path / "run" / "audit.db") if e.action == "run_end"]
    assert end[-1].payload()["stop_reason"] == "interrupted"
    assert read_checkpoint(tmp_path / "run").meta["round"] == summary["rounds_run"]


def test_ctrl_c_during_a_sweep_keeps_the_finished_rows(tmp_path: Path) -> None:
    process = subprocess.Popen([*FEDSEC, "sweep", "--quiet", "--out", str(tmp_path / "sw"),
                                "--epsilons", "1,2,4,8", "--seeds", "0", "--set", "rounds=3"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def rows() -> int:
        found = list(tmp_path.glob(".sw.*.tmp/sweep.csv"))
        return len(found[0].read_text().splitlines()) - 1 if found else 0

    _wait(lambda: rows() >= 2, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    kept = list(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))
    assert 2 <= len(kept) < 5
    assert kept[0]["dp_mode"] == "none" and all(r["stop_reason"] != "interrupted" for r in kept)


def test_resume_refuses_what_it_cannot_continue(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--resume"):
        resume_experiment(tmp_path / "nothing")
    with pytest.raises(ConfigError) as caught:
        check_resumable(make_config({"secure.aggregation": "paillier"}))
    assert caught.value.key == "secure.aggregation"
    with pytest.raises(ConfigError) as caught:
        check_resumable(make_config({"train.algorithm": "ditto"}))
    assert caught.value.key == "train.algorithm"


def test_resume_refuses_an_edited_config(tmp_path: Path) -> None:
    run_experiment(make_config({"rounds": 2}), out=tmp_path / "r")
    config = tmp_path / "r" / "config.toml"
    config.write_text(config.read_text().replace("rounds = 2", "rounds = 3"))
    with pytest.raises(ConfigError, match="not the configuration the checkpoint was written with"):
        resume_experiment(tmp_path / "r")
