"""`train.algorithm = ditto | perfedavg` from the command line, through masking, Paillier and DP."""

import json

import numpy as np
import pytest
from fedsec.fl_core.personalization import Ditto

from fedsec.cli import main
from fedsec.config import make_config
from fedsec.errors import ConfigError
from fedsec.experiment import build_experiment

NON_IID = {"data.partition": "dirichlet", "data.alpha": 0.3, "dp.mode": "none", "rounds": 5}


@pytest.mark.parametrize("values,key,says", [
    ({"personal.lam": 2.0}, "personal.lam", "needs train.algorithm = 'ditto'"),
    ({"personal.holdout": 0.5}, "personal.holdout", "'ditto' or 'perfedavg'"),
    ({"train.algorithm": "ditto", "personal.steps": 3}, "personal.steps",
     "needs train.algorithm = 'perfedavg'"),
    ({"train.algorithm": "perfedavg", "personal.lam": 3.0, "dp.mode": "none"}, "personal.lam",
     "needs train.algorithm = 'ditto'"),
    ({"train.algorithm": "perfedavg"}, "train.algorithm", "not DP-SGD steps"),
    ({"train.algorithm": "perfedavg", "dp.mode": "none", "train.server_optimizer": "adam"},
     "train.server_optimizer", "perfedavg's outer step"),
    ({"train.algorithm": "ditto", "personal.holdout": 1.0}, "personal.holdout", "(0, 1)"),
])
def test_the_config_refuses_what_cannot_run_naming_the_key(values, key, says):
    with pytest.raises(ConfigError) as caught:
        make_config(values)
    assert caught.value.key == key and says in str(caught.value)


def _summary(tmp_path, name, values):
    out = tmp_path / name
    args = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    assert main(["run", "--out", str(out), "--quiet", *args]) == 0
    return json.loads((out / "summary.json").read_text()), out


def test_ditto_under_masking_matches_plain_and_writes_its_report(tmp_path):
    values = {**NON_IID, "train.algorithm": "ditto", "personal.lam": 0.1}
    plain, _ = _summary(tmp_path, "plain", {**values, "secure.aggregation": "none"})
    masked, out = _summary(tmp_path, "masked", values)
    assert (out / "personalization.png").stat().st_size > 0
    for summary in (plain, masked):
        entry = summary["personalization"]
        assert len(entry["global_accuracy"]) == len(entry["personal_accuracy"]) == 4
        assert entry["mean_global_accuracy"] == pytest.approx(np.mean(entry["global_accuracy"]),
                                                             abs=1e-6)
    assert abs(masked["personalization"]["mean_personal_accuracy"]
               - plain["personalization"]["mean_personal_accuracy"]) <= 0.05
    assert abs(masked["final_accuracy"] - plain["final_accuracy"]) <= 0.02


def test_per_fedavg_under_paillier_matches_plain(tmp_path):
    values = {**NON_IID, "rounds": 3, "train.algorithm": "perfedavg", "personal.adapt_steps": 3}
    plain, _ = _summary(tmp_path, "plain", {**values, "secure.aggregation": "none"})
    he, _ = _summary(tmp_path, "he", {**values, "secure.aggregation": "paillier"})
    assert abs(he["final_accuracy"] - plain["final_accuracy"]) <= 0.02
    # local test sets hold 6 to 70 records: a quantisation-sized change may flip one of them
    assert abs(he["personalization"]["mean_personal_accuracy"]
               - plain["personalization"]["mean_personal_accuracy"]) <= 0.05


def test_under_dp_sgd_ditto_sends_exactly_what_fedavg_sends():
    """The personal model never crosses the seam: with the DP noise drawn from the seed, the global
    model of a Ditto run equals the run of its inner FedAvg (same DP-SGD trainer) alone."""
    config = make_config({**NON_IID, "rounds": 1, "dp.mode": "dpsgd", "dp.noise_multiplier": 1.0,
                          "dp.target_epsilon": 0.0, "dp.reproducible": True,
                          "secure.aggregation": "none", "train.algorithm": "ditto",
                          "personal.lam": 0.5})
    with_ditto = build_experiment(config)
    assert isinstance(with_ditto.server.strategy, Ditto)
    vector = with_ditto.server.run().vector
    alone = build_experiment(config)
    alone.server.strategy = alone.server.strategy.inner
    np.testing.assert_array_equal(alone.server.run().vector, vector)
    personal = with_ditto.server.strategy.personal_vector(with_ditto.server.data.clients[0])
    assert personal is not None and not np.array_equal(personal, vector)


def test_client_level_dp_with_per_fedavg_runs_and_accounts(tmp_path):
    summary, _ = _summary(tmp_path, "r", {**NON_IID, "rounds": 2, "train.algorithm": "perfedavg",
                                          "dp.mode": "client", "dp.target_epsilon": 10.0,
                                          "secure.aggregation": "none"})
    assert summary["privacy"]["epsilon"] > 0 and "personalization" in summary
