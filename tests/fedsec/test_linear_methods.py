"""``fedsec run`` with train.algorithm = cocoa / mocha: the refusals (with their reasons), the run
directory, and a CoCoA run through masking that matches the plain one."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from fedsec.cli import EXIT_CONFIG, main
from fedsec.config import make_config
from fedsec.errors import ConfigError
from fedsec.experiment import RUN_FILES, run_experiment

COCOA = {"train.algorithm": "cocoa", "dp.mode": "none", "secure.aggregation": "none"}
MOCHA = {"train.algorithm": "mocha", "dp.mode": "none", "secure.aggregation": "none"}


@pytest.mark.parametrize("values, key, reason", [
    ({**MOCHA, "secure.aggregation": "masking"}, "secure.aggregation", "individual per-client models"),
    ({**MOCHA, "secure.aggregation": "paillier"}, "secure.aggregation", "individual per-client models"),
    ({**MOCHA, "dp.mode": "client"}, "dp.mode", "needs every client's model"),
    ({**COCOA, "dp.mode": "dpsgd"}, "dp.mode", "w = A alpha"),
    ({**COCOA, "dp.mode": "client"}, "dp.mode", "set dp.mode = 'none'"),
    ({**MOCHA, "train.fraction": 0.5}, "train.fraction", "mocha.straggle"),
    ({**COCOA, "model.name": "mlp"}, "model.name", "linear"),
    ({**COCOA, "data.dataset": "digits"}, "data.dataset", "binary"),
    ({**COCOA, "train.lr": 0.5}, "train.lr", "does not apply"),
    ({**MOCHA, "train.local_epochs": 3}, "train.local_epochs", "does not apply"),
    ({"cocoa.lam": 0.1}, "cocoa.lam", "needs train.algorithm = 'cocoa'"),
    ({**COCOA, "mocha.straggle": 0.5}, "mocha.straggle", "needs train.algorithm = 'mocha'"),
    ({**COCOA, "cocoa.combine": "sum"}, "cocoa.combine", "adding"),
    ({**MOCHA, "mocha.holdout": 1.0}, "mocha.holdout", "(0, 1)"),
])
def test_the_config_refuses_what_cannot_run_naming_the_key_and_the_reason(values, key, reason):
    with pytest.raises(ConfigError) as caught:
        make_config(values)
    assert caught.value.key == key and reason in str(caught.value)


def test_the_cli_exits_2_for_mocha_with_masking_and_says_why(capsys):
    code = main(["run", "--set", "train.algorithm=mocha", "--set", "dp.mode=none", "--quiet"])
    assert code == EXIT_CONFIG
    assert "secure.aggregation" in capsys.readouterr().err


def test_cocoa_composes_with_masking_and_paillier_in_the_config():
    for aggregation in ("masking", "paillier"):
        config = make_config({**COCOA, "secure.aggregation": aggregation})
        assert config.train.algorithm == "cocoa"


def _rows(path):
    with open(path / "history.csv") as handle:
        return list(csv.DictReader(handle))


def test_a_cocoa_run_writes_the_run_directory_with_a_falling_gap(tmp_path, capsys):
    out = tmp_path / "cocoa"
    code = main(["run", "--out", str(out), "--quiet", "--set", "train.algorithm=cocoa", "--set",
                 "dp.mode=none", "--set", "secure.aggregation=none", "--set", "rounds=6", "--set",
                 "cocoa.loss=logistic", "--set", "cocoa.lam=0.01"])
    assert code == 0
    assert all((out / name).is_file() for name in (*RUN_FILES, "duality_gap.png"))
    gaps = [float(r["gap"]) for r in _rows(out)]
    assert len(gaps) == 6 and gaps[-1] < gaps[0] and min(gaps) >= 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cocoa"]["gamma"] == 1.0 and summary["cocoa"]["sigma_prime"] == 4.0
    assert summary["final_accuracy"] > 0.9
    assert summary["cocoa"]["final_gap"] == pytest.approx(gaps[-1])


def test_cocoa_through_masking_matches_the_plain_run():
    base = {**COCOA, "rounds": 3, "cocoa.loss": "logistic", "cocoa.lam": 0.01, "cocoa.local_steps": 40}
    plain = run_experiment(make_config(base))
    masked = run_experiment(make_config({**base, "secure.aggregation": "masking", "secure.clip": 4.0,
                                         "secure.bits": 24}))
    np.testing.assert_allclose(masked["cocoa"]["weights"], plain["cocoa"]["weights"], atol=1e-3)
    assert masked["cocoa"]["final_gap"] == pytest.approx(plain["cocoa"]["final_gap"], abs=1e-3)


def test_a_mocha_run_writes_per_client_accuracy_and_the_task_relationship(tmp_path):
    out = tmp_path / "mocha"
    summary = run_experiment(make_config({**MOCHA, "rounds": 5, "data.dataset": "synthetic",
                                          "data.setup": 4, "data.clients": 5, "data.samples": 500,
                                          "mocha.straggle": 0.3, "mocha.omega_every": 2}), out=out)
    assert all((out / name).is_file() for name in (*RUN_FILES, "duality_gap.png",
                                                   "task_relationship.png"))
    section = summary["mocha"]
    assert len(section["per_client_accuracy"]) == 5
    assert summary["final_accuracy"] == pytest.approx(np.mean(section["per_client_accuracy"]))
    sigma = np.array(section["sigma"])
    assert sigma.shape == (5, 5) and np.trace(sigma) == pytest.approx(1.0)
    assert [int(r["round"]) for r in _rows(out)] == [1, 2, 3, 4, 5]


def test_cocoa_with_client_sampling_adds_over_the_sampled_clients():
    summary = run_experiment(make_config({**COCOA, "rounds": 3, "train.fraction": 0.5,
                                          "cocoa.loss": "logistic", "cocoa.lam": 0.01}))
    assert summary["cocoa"]["gamma"] == 1.0 and summary["cocoa"]["sigma_prime"] == 2.0
    assert summary["cocoa"]["final_gap"] >= 0 and summary["rounds_run"] == 3
