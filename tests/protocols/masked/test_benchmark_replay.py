"""``python -m benchmarks.secagg --replay`` feeds the recorded round to fresh servers, which must
give the same sum (checked inside; a different sum fails the command), and prints one JSON object
last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # a subprocess: interpreter start and imports
def test_the_secagg_benchmark_replays_the_round_exactly():
    done = subprocess.run([sys.executable, "-m", "benchmarks.secagg", "--clients", "12", "--params", "500",
                           "--graph", "harary", "--dropout", "0.2", "--replay", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exact"] is True and result["dropped"] >= 2
    assert len(result["replay_s"]) == 2 and len(result["replay_cpu_s"]) == 2
    assert result["replay_over_raw_aes"] > 0
    assert result["masks_regenerated"] > result["clients"] - result["dropped"]
    # The default server has a worker process; each replay is followed by a one-process one.
    assert result["workers"] == min(2, os.cpu_count() or 1) and result["interleaved"] is False
    if result["workers"] > 1:
        assert len(result["replay_single_s"]) == 2 and result["replay_single_cpu_over_raw_aes_cpu"] > 0
