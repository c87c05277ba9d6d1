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
    """Empty the PLD and PRV accountants' process-wide engine caches before the test, so that a test
    comparing an in-process run with a fresh subprocess starts both alike. A reported epsilon no
    longer depends on what the engines were asked before (tests/dp/test_history_free_epsilon.py:
    the grid from a fixed ladder, F^T by binary powering); this keeps such tests from relying on
    that property alone."""
    from fedsec.dp.analysis import pld_running, prv_running

    pld_running._ENGINES.clear()
    prv_running._ENGINES.clear()
    yield
