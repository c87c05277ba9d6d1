"""One local Ray (2 CPUs, no dashboard) shared by every Ray test of the session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    import ray

    from fedsec.backends import connect

    connect(num_cpus=2)
    yield ray
    ray.shutdown()
