"""Start a deployed federation as real OS processes on 127.0.0.1 and always clean up."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fedsec.audit.log import read_events
from fedsec.network import demo

TIMEOUT = 240.0
"""Bound on a whole federation run in a test (the machine is shared and slow to import torch)."""


@dataclass
class Running:
    d: demo.Deployment
    coordinator: subprocess.Popen
    port: int
    sites: dict[int, subprocess.Popen] = field(default_factory=dict)

    def join(self, k: int, *, policy: Path | None = None) -> subprocess.Popen:
        log = open(self.d.root / f"site-{k}.log", "w")
        self.sites[k] = subprocess.Popen(demo.join_command(self.d, k, self.port, policy=policy), stdout=log,
                                         stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self.sites[k]

    def wait(self, timeout: float = TIMEOUT) -> tuple[int, str]:
        """The coordinator's exit code and output, once it ends; then the sites'."""
        out, _ = self.coordinator.communicate(timeout=timeout)
        for p in self.sites.values():
            p.wait(timeout=60)
        return self.coordinator.returncode, out

    def site_log(self, k: int) -> str:
        return (self.d.root / f"site-{k}.log").read_text()


@contextmanager
def federation(d: demo.Deployment):
    """A coordinator for ``d``; every process it and the test start is killed on the way out."""
    coordinator, port = demo.start_coordinator(d, log=d.root / "coordinator.log")
    running = Running(d, coordinator, port)
    try:
        yield running
    finally:
        for p in [coordinator, *running.sites.values()]:
            if p.poll() is None:
                p.kill()
                p.wait()


def wait_for_event(path: Path, action: str, round_index: int | None, timeout: float = TIMEOUT) -> None:
    """Block until the audit log at ``path`` holds ``action`` for ``round_index``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            try:
                if any(e.action == action and e.round == round_index for e in read_events(path)):
                    return
            except Exception:  # noqa: BLE001 - the writer may be mid-transaction; read again
                pass
        time.sleep(0.05)
    raise TimeoutError(f"{action} of round {round_index} never appeared in {path}")


def site_db_has(state: Path, query: str, parameters: tuple = ()) -> bool:
    """Whether ``query`` finds a row in the ``site.db`` of the state folder ``state``, read-only and
    while the site runs; False while the file is absent or locked."""
    path = state / "site.db"
    if not path.exists():
        return False
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        try:
            return db.execute(query, parameters).fetchone() is not None
        finally:
            db.close()
    except sqlite3.Error:
        return False
