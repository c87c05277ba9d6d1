"""examples/hospitals_mlp.py runs (fast settings) and prints epsilon per round within its target."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hospitals_mlp.py"


def test_the_hospital_example_trains_and_prints_epsilon_every_round(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--rounds", "2", "--data", str(tmp_path)])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"hospital_{k}.csv" for k in range(4)]
    rounds = re.findall(r"round +(\d+) +accuracy ([\d.]+) +AUROC ([\d.]+) +epsilon ([\d.]+)", out)
    assert [int(r[0]) for r in rounds] == [1, 2]
    epsilons = [float(r[3]) for r in rounds]
    assert epsilons == sorted(epsilons) and 0 < epsilons[-1] <= 3.0
    assert float(rounds[-1][1]) > 0.85 and float(rounds[-1][2]) > 0.9
    assert "final: accuracy" in out
