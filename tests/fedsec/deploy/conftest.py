"""Every deployment test compares a fresh coordinator process with an in-process simulation: both
start from empty accountant caches (``fresh_accountant_engines``, tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _fresh_engines(fresh_accountant_engines):
    yield
