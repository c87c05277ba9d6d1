"""A deployed party keeps the memory it frees: model-sized arrays allocated and freed stage after
stage stop costing fresh pages (counted as the process's minor page faults, not timed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedsec.network import heap

PROBE = """
import json, resource, sys
import numpy as np
from fedsec.network.heap import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
vector = np.random.default_rng(0).normal(size=100_001)

def stage():
    # what a masking stage does with a 100k-parameter update: a few model-sized temporaries
    scaled = (np.clip(vector, -1, 1) + 1) * 32767.5
    floor = np.floor(scaled)
    words = (floor + (scaled - floor > 0.5)).astype(np.uint64) * np.uint64(30)
    return int(words[-1])

for _ in range(5):
    stage()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    stage()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50
print(json.dumps({"kept": kept, "faults": faults}))
"""


def faults_per_stage(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not heap.glibc(), reason="mallopt thresholds are glibc's")
def test_freed_model_sized_arrays_stay_in_the_heap():
    default, kept = faults_per_stage("default"), faults_per_stage("keep")
    assert kept["kept"] is True
    # glibc by default maps and unmaps each 0.8 MB temporary: about 200 fresh pages per array
    assert default["faults"] > 300
    assert kept["faults"] < 10


@pytest.mark.parametrize("key", ["mmap_threshold", "trim_threshold"])
@pytest.mark.parametrize("value", [0, 1024, (1 << 30) + 1, True, 1.5e6])
def test_thresholds_out_of_range_are_refused(key, value):
    with pytest.raises(ValueError, match=key):
        heap.keep_freed_memory(**{key: value})
