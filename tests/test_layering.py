"""Imports run one way (docs/architecture.md).

``fedsec.secagg``, ``fedsec.dp`` and ``fedsec.fl_core`` import none of each other; ``fedsec.protocols``
imports those three and nothing of the face; nothing below the face knows gRPC, SQLite or Ray; and the
network layer is reached from the rest of the face only through the CLI hook.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.M)
INNER = ("fl_core", "secagg", "dp", "protocols")
ALLOWED = {
    "fl_core": set(),
    "secagg": set(),
    "dp": set(),
    "protocols": {"fl_core", "secagg", "dp"},
}
FOREIGN = ("grpc", "sqlite3", "ray")


def _imports(folder: str) -> dict[str, set[str]]:
    found = {}
    for path in (ROOT / folder).rglob("*.py"):
        found[str(path.relative_to(ROOT))] = set(IMPORT.findall(path.read_text()))
    return found


def test_the_inner_packages_import_only_downwards():
    offenders = []
    for package in INNER:
        for path, modules in _imports(package).items():
            for module in modules:
                parts = module.split(".")
                if parts[0] in FOREIGN:
                    offenders.append((path, module))
                if parts[0] != "fedsec":
                    continue
                target = parts[1] if len(parts) > 1 else ""
                if target != package and target not in ALLOWED[package]:
                    offenders.append((path, module))
    assert offenders == []


def test_the_network_layer_is_imported_by_the_face_only_through_its_cli_hook():
    users = [path for path, modules in _imports("fedsec").items()
             if not path.startswith("fedsec/network/")
             and any(m.startswith("fedsec.network") for m in modules)]
    assert users == ["fedsec/cli.py"]
