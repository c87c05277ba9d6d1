"""Imports run one way: nothing below ``fedsec`` imports the network layer, and it knows no SQLite
or gRPC below it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_no_package_below_fedsec_imports_the_network_layer_or_grpc():
    pattern = re.compile(r"^\s*(from|import)\s+(fedsec|grpc)\b", re.M)
    offenders = [str(path.relative_to(ROOT)) for package in ("secagg", "dp", "fl_core", "protocols")
                 for path in (ROOT / package).rglob("*.py") if pattern.search(path.read_text())]
    assert offenders == []


def test_the_network_layer_is_imported_by_fedsec_only_through_its_cli_hook():
    users = [str(path.relative_to(ROOT)) for path in (ROOT / "fedsec").rglob("*.py")
             if "network" not in path.parts and re.search(r"fedsec\.network", path.read_text())]
    assert users == ["fedsec/cli.py"]
