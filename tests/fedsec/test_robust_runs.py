"""`[robust]` from the command line: refusals, and Byzantine hospitals against the unmodified
honest clients and protocols."""

import json

import numpy as np
import pytest

from fedsec.cli import main
from fedsec.config import make_config
from fedsec.errors import ConfigError
from fedsec.experiment import build_experiment
from fedsec.methods.robust import byzantine_clients

PLAIN = {"secure.aggregation": "none", "dp.mode": "none"}


@pytest.mark.parametrize("values,key,says", [
    ({"robust.rule": "median", "dp.mode": "none"}, "robust.rule", "hides by design"),
    ({"robust.rule": "trimmed_mean", "secure.aggregation": "paillier", "dp.mode": "none"},
     "robust.rule", "individual update"),
    ({"robust.rule": "median", "secure.aggregation": "none", "dp.mode": "client",
      "dp.target_epsilon": 5.0}, "robust.rule", "sensitivity"),
    ({"robust.rule": "norm_bound", "dp.mode": "client"}, "robust.rule", "redundant"),
    ({"robust.trim": 0.2, **PLAIN}, "robust.trim", "needs robust.rule = 'trimmed_mean'"),
    ({"robust.norm_bound": 2.0}, "robust.norm_bound", "needs robust.rule = 'norm_bound'"),
    ({"robust.byzantine": 4}, "robust.byzantine", "must be < data.clients = 4"),
    ({"robust.attack": "noise"}, "robust.attack", "needs robust.byzantine >= 1"),
    ({"robust.factor": 3.0}, "robust.factor", "needs robust.byzantine >= 1"),
    ({"robust.trim": 0.5, **PLAIN}, "robust.trim", "[0, 0.5)"),
])
def test_the_config_refuses_what_cannot_run_naming_the_key(values, key, says):
    with pytest.raises(ConfigError) as caught:
        make_config(values)
    assert caught.value.key == key and says in str(caught.value)


def test_the_cli_exits_2_on_median_with_masking_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--set", "robust.rule=median", "--out", str(out), "--quiet"]) == 2
    assert "robust.rule" in capsys.readouterr().err and not out.exists()


def _accuracy(values, rounds=12):
    experiment = build_experiment(make_config({"rounds": rounds, **values}))
    records = experiment.server.run().records
    return float(np.mean([r.accuracy for r in records[-4:]]))


@pytest.mark.parametrize("clients,bad", [(4, 1), (10, 3)])
def test_noise_sending_hospitals_break_the_mean_and_not_the_robust_rules(clients, bad):
    attack = {"data.clients": clients, "robust.byzantine": bad, "robust.attack": "noise",
              "robust.factor": 100.0}
    honest = _accuracy({"data.clients": clients, **PLAIN})
    assert honest > 0.9
    assert _accuracy({**attack, **PLAIN}) < honest - 0.3
    assert _accuracy({**attack, **PLAIN, "robust.rule": "median"}) > honest - 0.03
    assert _accuracy({**attack, **PLAIN, "robust.rule": "trimmed_mean", "robust.trim": 0.3}) > honest - 0.03
    # masking with the clients' L2 bound: the honest protocol, only the bound added
    assert _accuracy({**attack, "dp.mode": "none", "robust.rule": "norm_bound",
                      "robust.norm_bound": 0.5}) > honest - 0.03


def test_norm_bound_under_paillier_records_the_clipped_updates(tmp_path):
    out = tmp_path / "r"
    assert main(["run", "--out", str(out), "--quiet", "--set", "rounds=2", "--set", "dp.mode=none",
                 "--set", "secure.aggregation=paillier", "--set", "robust.rule=norm_bound",
                 "--set", "robust.norm_bound=0.05", "--set", "robust.byzantine=1",
                 "--set", "robust.attack=scale"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["robust"] == {"rule": "norm_bound", "norm_bound": 0.05, "byzantine": [2],
                                 "attack": "scale", "factor": 10.0}
    rows = (out / "history.csv").read_text().splitlines()
    column = rows[0].split(",").index("norm_clipped")
    assert [float(r.split(",")[column]) for r in rows[1:]] == [4.0, 4.0]


def test_the_byzantine_clients_are_drawn_from_the_seed():
    picks = {seed: byzantine_clients(make_config({"seed": seed, "robust.byzantine": 3,
                                                  "data.clients": 10, **PLAIN}))
             for seed in range(6)}
    assert all(len(set(p)) == 3 and all(0 <= k < 10 for k in p) for p in picks.values())
    assert len(set(picks.values())) > 1
    assert picks[0] == byzantine_clients(make_config({"seed": 0, "robust.byzantine": 3,
                                                      "data.clients": 10, **PLAIN}))


def test_under_real_masking_a_searching_byzantine_client_moves_the_average_by_at_most_its_bound():
    """The honest masking protocol, unmodified, with the clients' L2 bound in front: one client
    (at random) sends a random lie of random size (1e-3 to 1e6); the released average moves from
    the honest one by at most 2 * bound * w_k / W (plus quantisation)."""
    from fedsec.fl_core import ClientUpdate
    from fedsec.fl_core.robust import NormBoundedAggregation
    from fedsec.protocols.masked import MaskedAggregation

    rng = np.random.default_rng(5)
    bound, d = 0.5, 20
    protocol = NormBoundedAggregation(inner=MaskedAggregation(max_weight=100, rng=rng), bound=bound)
    for trial in range(8):
        weights = rng.integers(10, 100, size=4).astype(float)
        honest = [rng.normal(0, 0.05, size=d).astype(np.float32) for _ in range(4)]
        bad = int(rng.integers(4))
        lie = (rng.normal(size=d) * 10.0 ** rng.uniform(-3, 6)).astype(np.float32)
        sent = [lie if k == bad else v for k, v in enumerate(honest)]
        clean = protocol.aggregate(2 * trial + 1, [ClientUpdate(k, v, w) for k, (v, w) in
                                                   enumerate(zip(honest, weights))]).average()
        attacked = protocol.aggregate(2 * trial + 2, [ClientUpdate(k, v, w) for k, (v, w) in
                                                      enumerate(zip(sent, weights))])
        shift = np.linalg.norm(attacked.average().astype(np.float64) - clean)
        assert shift <= 2 * bound * weights[bad] / weights.sum() + 1e-3
        assert attacked.participants == (0, 1, 2, 3)
