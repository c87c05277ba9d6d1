"""A site's lifetime epsilon ledger in SQLite (stdlib ``sqlite3``, WAL, synchronous FULL).

Before a site touches its data for a run it reserves the run's whole epsilon budget here, keyed by
the run's identifier (the plan's SHA-256). A reservation is one ``BEGIN IMMEDIATE`` transaction
that sums what is already reserved and refuses (``PolicyRefused('dp.max_epsilon_lifetime')``) a
run that would take the total past the lifetime cap; with ``synchronous = FULL`` the row is on disk
when :meth:`EpsilonLedger.reserve` returns. Reserving the same run again (a coordinator restart
resending the same plan) charges nothing more; a new plan is a new charge. Nothing is ever
refunded: a run that stops early has still been admitted at its full budget, so neither lying
about rounds nor restarting lets a coordinator spend more than the cap.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

from fedsec.network.errors import PolicyRefused
from fedsec.state.durable import open_durable

_SCHEMA = ("CREATE TABLE IF NOT EXISTS reservations (run_id TEXT PRIMARY KEY, epsilon REAL NOT NULL, "
           "reserved_at TEXT NOT NULL)")
_TOLERANCE = 1e-9


class EpsilonLedger:
    """The epsilon a site has committed over its lifetime, in ``STATE_DIR/ledger.db``.

    Args:
        state_dir: the site's state directory (created if missing).
        lifetime_cap: the most epsilon over all runs, > 0 (the policy's ``dp.max_epsilon_lifetime``).
    """

    def __init__(self, state_dir: str | Path, *, lifetime_cap: float) -> None:
        if not (isinstance(lifetime_cap, int | float) and math.isfinite(lifetime_cap) and lifetime_cap > 0):
            raise ValueError("lifetime_cap: must be a finite number > 0")
        self.lifetime_cap = float(lifetime_cap)
        directory = Path(state_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "ledger.db"
        self._db = open_durable(self.path, schema=_SCHEMA)

    def spent(self) -> float:
        """Total epsilon reserved by every run so far."""
        return float(self._db.execute("SELECT COALESCE(SUM(epsilon), 0) FROM reservations").fetchone()[0])

    def runs(self) -> list[tuple[str, float, str]]:
        """Every reservation as ``(run_id, epsilon, reserved_at ISO-8601 UTC)``, oldest first."""
        return [(r, float(e), t) for r, e, t in
                self._db.execute("SELECT run_id, epsilon, reserved_at FROM reservations ORDER BY rowid")]

    def reserve(self, run_id: str, epsilon: float, *, dry_run: bool = False) -> float:
        """Reserve ``epsilon`` (>= 0, finite) for ``run_id``; returns the lifetime total after it.

        With ``dry_run`` the same checks run and nothing is written.

        Raises:
            PolicyRefused: ``dp.max_epsilon_lifetime`` when the total would exceed the cap, or
                ``dp.ledger`` when ``run_id`` was reserved before at a different epsilon.
            ValueError: an empty ``run_id`` or a bad ``epsilon``.
        """
        if not run_id or not isinstance(run_id, str):
            raise ValueError("run_id: must be a non-empty string")
        if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon >= 0):
            raise PolicyRefused("dp.max_epsilon_lifetime", f"the run's epsilon {epsilon} is not a finite "
                                                           f"number >= 0")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT epsilon FROM reservations WHERE run_id = ?", (run_id,)).fetchone()
            total = self.spent()
            if row is not None:
                if abs(float(row[0]) - epsilon) > _TOLERANCE:
                    raise PolicyRefused("dp.ledger", f"run {run_id} was admitted at epsilon {row[0]:g}, "
                                                     f"not {epsilon:g}")
            elif total + epsilon > self.lifetime_cap + _TOLERANCE:
                raise PolicyRefused("dp.max_epsilon_lifetime",
                                    f"this site has spent epsilon {total:g} of its lifetime "
                                    f"{self.lifetime_cap:g}; "
                                    f"the run needs {epsilon:g}")
            else:
                if not dry_run:
                    self._db.execute("INSERT INTO reservations (run_id, epsilon, reserved_at) "
                                     "VALUES (?, ?, ?)",
                                     (run_id, float(epsilon), dt.datetime.now(dt.timezone.utc).isoformat()))
                total += epsilon
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return total

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> EpsilonLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
