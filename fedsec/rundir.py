"""The ``--out`` directory: checked before a run, written into a staging folder, swapped in at the end.

A run never mixes with an earlier one. Without ``force`` an existing non-empty directory is refused;
with ``force`` it is replaced whole, and only if it looks like a fedsec output (it holds one of
:data:`MARKERS`), so ``--out . --force`` cannot wipe a folder of the user's own files. The new run
is written into a hidden sibling folder and renamed into place when the run ends (also when it
fails or is interrupted, so the directory still says what was done); the old one is removed only
then.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

from fedsec.errors import ConfigError

MARKERS = ("summary.json", "history.csv", "config.toml", "sweep.csv")
"""Files whose presence marks a directory as an earlier fedsec run or sweep."""


def check_out(out: str | Path, *, force: bool = False) -> Path:
    """Validate ``--out`` without writing anything; returns it as a Path.

    Raises:
        ConfigError: (key ``--out``) the path is a file, a non-empty directory without ``force``,
            or a non-empty directory that is not a fedsec output even with ``force``.
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError("--out", f"{path} is a file, not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise ConfigError("--out", f"{path} is not empty; pass --force to replace it")
        if not any((path / name).exists() for name in MARKERS):
            raise ConfigError("--out", f"{path} is not empty and holds no earlier fedsec run; "
                                       f"refusing to replace it even with --force")
    return path


class RunDirectory:
    """A staging folder next to ``out`` that :meth:`publish` swaps into place.

    Create it only after validation passed: creating it checks that ``out``'s parent is writable.

    Raises:
        ConfigError: (key ``--out``) the parent cannot be created or written.
    """

    def __init__(self, out: str | Path, *, force: bool = False) -> None:
        self.out = check_out(out, force=force)
        parent = self.out.absolute().parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            self.path = _fresh(parent, self.out.name, "tmp")
        except OSError as error:
            raise ConfigError("--out", f"cannot write {self.out}: {error.strerror}") from None

    @classmethod
    def adopt(cls, out: str | Path, path: Path) -> RunDirectory:
        """The staging folder ``path`` of an earlier, killed run into ``out`` (``--resume``)."""
        self = cls.__new__(cls)
        self.out, self.path = Path(out), path
        return self

    def publish(self) -> Path:
        """Replace ``out`` with the staging folder (the old run, if any, is deleted)."""
        old = None
        if self.out.exists():
            old = _fresh(self.out.absolute().parent, self.out.name, "old")
            os.replace(self.out, old / "run")
        os.replace(self.path, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out

    def discard(self) -> None:
        """Remove the staging folder (a run that failed validation late)."""
        shutil.rmtree(self.path, ignore_errors=True)


def _fresh(parent: Path, name: str, kind: str) -> Path:
    """A new hidden folder ``.NAME.RANDOM.KIND`` in ``parent`` (default permissions)."""
    path = parent / f".{name}.{secrets.token_hex(6)}.{kind}"
    path.mkdir()
    return path
