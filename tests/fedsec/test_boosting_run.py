"""``fedsec run`` with train.algorithm = 'boosting': refusals, the run directory, exactness end to end."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from fedsec.fl_core.boosting import FederatedBoosting
from fedsec.fl_core.standardize import apply_standardization, federated_moments

from fedsec import fl_core
from fedsec.cli import main
from fedsec.config import make_config
from fedsec.errors import ConfigError
from fedsec.methods.boosting import boosting_spec, prepare_boosting

BOOST = {"train.algorithm": "boosting", "dp.mode": "none"}


@pytest.mark.parametrize(("values", "key", "says"), [
    ({"train.algorithm": "boosting"}, "dp.mode", "no DP noise"),
    ({**BOOST, "train.lr": 0.5}, "train.lr", "does not apply"),
    ({**BOOST, "train.local_epochs": 3}, "train.local_epochs", "does not apply"),
    ({**BOOST, "data.clients": 8, "train.fraction": 0.5}, "train.fraction", "fraction = 1"),
    ({**BOOST, "model.name": "mlp"}, "model.name", "additive model"),
    ({**BOOST, "secure.dropout": 0.2}, "secure.dropout", "every client's sums"),
    ({**BOOST, "data.dataset": "digits", "secure.aggregation": "none"}, "data.dataset", "binary"),
    ({**BOOST, "data.standardize": False}, "boosting.learners", "public range"),
    ({**BOOST, "boosting.df": 2.0}, "boosting.df", "must be in"),
    ({**BOOST, "boosting.df": 40.0}, "boosting.df", "must be in"),
    ({**BOOST, "boosting.nu": 0.0}, "boosting.nu", "(0, 1]"),
    ({"boosting.nu": 0.3}, "boosting.nu", "needs train.algorithm = 'boosting'"),
    ({"dp.mode": "none", "boosting.family": "gaussian"}, "boosting.family", "needs train.algorithm"),
])
def test_config_refuses_what_boosting_cannot_do(values, key, says) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(values)
    assert caught.value.key == key
    assert says in str(caught.value)


def test_linear_learners_need_no_standardisation() -> None:
    config = make_config({**BOOST, "data.standardize": False, "boosting.learners": "linear"})
    assert config.boosting.learners == "linear"


def test_cli_refusal_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["run", "--set", "train.algorithm=boosting", "--out", str(out), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsec: error: dp.mode: boosting sends its sums") and "\n" not in err
    assert not out.exists()


def _rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_run_directory_and_the_fit_equal_a_direct_fit(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    args = ["run", "--set", "train.algorithm=boosting", "--set", "dp.mode=none", "--set", "rounds=12",
            "--set", "secure.aggregation=none", "--set", "boosting.knots=8", "--out", str(out),
            "--quiet"]
    assert main(args) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["rounds_run"] == 12
    for name in ("config.toml", "history.csv", "summary.json", "model.pt", "accuracy.png",
                 "coefficients.png"):
        assert (out / name).stat().st_size > 0, name
    rows = _rows(out / "history.csv")
    assert [int(r["round"]) for r in rows] == list(range(1, 13))
    assert all(r["selected"].startswith(("linear(x", "pspline(x")) for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    counts = {s["learner"]: s["iterations"] for s in summary["boosting"]["selected"]}
    assert sum(counts.values()) == 12
    assert counts == {k: sum(r["selected"] == k for r in rows) for k in counts}

    config = make_config({**BOOST, "rounds": 12, "secure.aggregation": "none", "boosting.knots": 8})
    data = prepare_boosting(config).data
    mean, std, _ = federated_moments(data, fl_core.PlainAggregation())
    data = apply_standardization(data, mean, std)
    direct = FederatedBoosting(spec=boosting_spec(config), protocol=fl_core.PlainAggregation(),
                               iterations=12).fit(data.clients)
    state = torch.load(out / "model.pt")
    assert float(state["offset"][0]) == pytest.approx(direct.model.offset, abs=1e-12)
    for learner, beta in zip(direct.model.learners, direct.model.coefficients, strict=True):
        np.testing.assert_allclose(state[learner.name].numpy(), beta, atol=1e-10)
    assert [r["selected"] for r in rows] == [s.learner for s in direct.steps]
    assert float(rows[-1]["accuracy"]) == pytest.approx(
        float(np.mean(direct.model.predict(data.test.x) == data.test.y)))


def test_masked_run_stops_at_the_target_accuracy(tmp_path) -> None:
    from fedsec.experiment import run_experiment

    config = make_config({**BOOST, "rounds": 80, "train.target_accuracy": 0.9,
                          "boosting.learners": "linear"})
    summary = run_experiment(config, out=tmp_path / "run")
    assert summary["stop_reason"] == "target_accuracy"
    assert summary["rounds_run"] == summary["rounds_to_target"] < 80
    assert summary["final_accuracy"] >= 0.9
    rows = _rows(tmp_path / "run" / "history.csv")
    assert len(rows) == summary["rounds_run"] and int(rows[0]["upload_bytes"]) > 0


def test_the_library_example_in_the_docs_runs(capsys) -> None:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "algorithms-boosting.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "algorithms-boosting.md", "exec"), {})
    counts, accuracy = capsys.readouterr().out.strip().rsplit("} ", 1)
    assert "pspline(x" in counts and float(accuracy) > 0.9
