"""Shared test settings: one torch thread (the bundled models are tiny) and hypothesis profiles."""

import pytest
import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)

settings.register_profile(
    "fedsec", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("fedsec")


@pytest.fixture
def fresh_accountant_engines():
    """Empty the PLD and PRV accountants' process-wide engine caches before the test: a reported
    epsilon's last digits depend on the FFT grid an engine grew into, so a test that compares an
    in-process run with a fresh subprocess starts both from empty caches (whatever ran before it
    in this pytest worker)."""
    from fedsec.dp.analysis import pld_running, prv_running

    pld_running._ENGINES.clear()
    prv_running._ENGINES.clear()
    yield
