"""`fedsec sweep` with sim.backend = "ray": parallel runs, the local backend's rows."""

from __future__ import annotations

import csv

import pytest

from fedsec.config import make_config
from fedsec.sweep import run_sweep

pytestmark = pytest.mark.slow

CONFIG = {"seed": 0, "rounds": 2, "data.clients": 4, "secure.aggregation": "none",
          "dp.mode": "dpsgd", "dp.reproducible": True, "dp.target_epsilon": 1.0}


def rows(path) -> list[dict[str, str]]:
    return list(csv.DictReader(open(path / "sweep.csv")))


def test_a_ray_sweep_writes_the_local_sweeps_rows(ray_local, tmp_path):
    run_sweep(make_config(CONFIG), epsilons=[2.0, 8.0], seeds=[0], out=tmp_path / "local")
    result = run_sweep(make_config({**CONFIG, "sim.backend": "ray"}), epsilons=[2.0, 8.0], seeds=[0],
                       out=tmp_path / "ray")
    local, remote = rows(tmp_path / "local"), rows(tmp_path / "ray")
    assert len(remote) == 3 and result["runs"] == 2
    assert [r["dp_mode"] for r in remote] == ["none", "dpsgd", "dpsgd"]  # the baseline row first
    key = lambda r: (r["dp_mode"], r["target_epsilon"], r["seed"])  # noqa: E731
    assert sorted(remote, key=key) == sorted(local, key=key)
    assert (tmp_path / "ray" / "sweep.png").exists()
