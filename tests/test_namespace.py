"""Installed, fedsec occupies one top-level import name: `fedsec`.

The repository keeps its top-level folders (fl_core/, secagg/, dp/, protocols/); pyproject.toml maps
them to fedsec.fl_core, fedsec.secagg, fedsec.dp and fedsec.protocols. A user's own `protocols.py`
or `dp.py` beside their script must not disturb `import fedsec`.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
INNER = ("fl_core", "secagg", "dp", "protocols")

_IMPORT_ALL = """
import importlib, pkgutil, sys
import fedsec
names = []
for top in ("fedsec", "fedsec.fl_core", "fedsec.secagg", "fedsec.dp", "fedsec.protocols"):
    package = importlib.import_module(top)
    names.append(top)
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        if not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
            names.append(info.name)
import protocols, dp, secagg, fl_core
mine = (protocols, dp, secagg, fl_core)
assert all(m.SHADOW for m in mine), "the user's own modules are not the ones imported"
leaked = sorted(m.__name__ for m in mine if m.__file__.startswith({root!r}))
assert not leaked, leaked
print(len(names))
"""


def test_user_modules_named_like_ours_do_not_disturb_fedsec(tmp_path: pathlib.Path) -> None:
    for name in INNER:
        (tmp_path / f"{name}.py").write_text("SHADOW = True\n")
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL.format(root=str(ROOT))], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) > 40  # every module of every sub-package was imported


def test_every_package_folder_is_installed_under_fedsec() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"fedsec": "fedsec", **{f"fedsec.{p}": p for p in INNER}}
    on_disk = set()
    for top in ("fedsec", *INNER):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            on_disk.add(".".join(parts) if top == "fedsec" else "fedsec." + ".".join(parts))
    assert set(config["packages"]) == on_disk


def test_no_source_imports_the_bare_inner_names() -> None:
    pattern = re.compile(r"^\s*(from|import)\s+(fl_core|secagg|dp|protocols)(\.|\s|$)", re.M)
    offenders = []
    for folder in ("fedsec", *INNER, "benchmarks", "examples", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if pattern.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders
