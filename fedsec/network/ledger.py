"""A site's lifetime epsilon ledger in SQLite (stdlib ``sqlite3``, WAL, synchronous FULL).

Before a site touches its data for a run it reserves the run's whole epsilon budget here, keyed by
the run's identifier (the plan's SHA-256). A reservation is one ``BEGIN IMMEDIATE`` transaction
that sums what is already reserved and refuses (``PolicyRefused('dp.max_epsilon_lifetime')``) a
run that would take the total past the lifetime cap; with ``synchronous = FULL`` the row is on disk
when :meth:`EpsilonLedger.reserve` returns. Reserving the same run again (a coordinator restart
resending the same plan) charges nothing more; a new plan is a new charge. Nothing is ever
refunded: a run that stops early has still been admitted at its full budget, so neither lying
about rounds nor restarting lets a coordinator spend more than the cap.

Each reservation records its privacy unit: ``example`` (DP-SGD: one record) or ``client``
(client-level DP: the site's whole contribution). One cap covers both: a client-level epsilon
also bounds what the run reveals about any one record, so the sum over both units is an upper
bound on the site's record-level lifetime epsilon (:meth:`EpsilonLedger.spent_by_unit` tells them
apart). A ledger written before units were recorded reads its rows as ``example``.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

from fedsec.network.errors import PolicyRefused
from fedsec.state.durable import open_durable

_SCHEMA = ("CREATE TABLE IF NOT EXISTS reservations (run_id TEXT PRIMARY KEY, epsilon REAL NOT NULL, "
           "reserved_at TEXT NOT NULL, unit TEXT NOT NULL DEFAULT 'example')")
UNITS = ("example", "client")
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
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(reservations)")}
        if "unit" not in columns:  # a ledger from before units were recorded
            self._db.execute("ALTER TABLE reservations ADD COLUMN unit TEXT NOT NULL DEFAULT 'example'")

    def spent(self) -> float:
        """Total epsilon reserved by every run so far."""
        return float(self._db.execute("SELECT COALESCE(SUM(epsilon), 0) FROM reservations").fetchone()[0])

    def spent_by_unit(self) -> dict[str, float]:
        """Epsilon reserved so far per privacy unit (``example``, ``client``)."""
        return {u: float(e) for u, e in
                self._db.execute("SELECT unit, SUM(epsilon) FROM reservations GROUP BY unit ORDER BY unit")}

    def runs(self) -> list[tuple[str, float, str]]:
        """Every reservation as ``(run_id, epsilon, reserved_at ISO-8601 UTC)``, oldest first."""
        return [(r, float(e), t) for r, e, t in
                self._db.execute("SELECT run_id, epsilon, reserved_at FROM reservations ORDER BY rowid")]

    def reserve(self, run_id: str, epsilon: float, *, unit: str = "example", dry_run: bool = False) -> float:
        """Reserve ``epsilon`` (>= 0, finite) for ``run_id`` in privacy ``unit`` (``example`` or
        ``client``); returns the lifetime total (both units) after it.

        With ``dry_run`` the same checks run and nothing is written.

        Raises:
            PolicyRefused: ``dp.max_epsilon_lifetime`` when the total would exceed the cap, or
                ``dp.ledger`` when ``run_id`` was reserved before at a different epsilon or unit.
            ValueError: an empty ``run_id`` or an unknown ``unit``.
        """
        if not run_id or not isinstance(run_id, str):
            raise ValueError("run_id: must be a non-empty string")
        if unit not in UNITS:
            raise ValueError(f"unit: must be one of {', '.join(UNITS)}, got {unit!r}")
        if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon >= 0):
            raise PolicyRefused("dp.max_epsilon_lifetime", f"the run's epsilon {epsilon} is not a finite "
                                                           f"number >= 0")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT epsilon, unit FROM reservations WHERE run_id = ?",
                                   (run_id,)).fetchone()
            total = self.spent()
            if row is not None:
                if abs(float(row[0]) - epsilon) > _TOLERANCE or row[1] != unit:
                    raise PolicyRefused("dp.ledger", f"run {run_id} was admitted at epsilon {row[0]:g} "
                                                     f"({row[1]} level), not {epsilon:g} ({unit} level)")
            elif total + epsilon > self.lifetime_cap + _TOLERANCE:
                raise PolicyRefused("dp.max_epsilon_lifetime",
                                    f"this site has spent epsilon {total:g} of its lifetime "
                                    f"{self.lifetime_cap:g}; "
                                    f"the run needs {epsilon:g}")
            else:
                if not dry_run:
                    self._db.execute("INSERT INTO reservations (run_id, epsilon, reserved_at, unit) "
                                     "VALUES (?, ?, ?, ?)",
                                     (run_id, float(epsilon), dt.datetime.now(dt.timezone.utc).isoformat(),
                                      unit))
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
