"""What a site keeps across restarts besides its epsilon ledger: the plans it accepted and the
rounds it contributed to (``STATE_DIR/site.db``, SQLite WAL, synchronous FULL).

It also records which contributions went into an aggregation (``consumed``: run, kind, round),
so a contribution is summed at most once, across restarts too (:meth:`SiteState.consume`).

It is also the masked protocol's durable session record: one (session, round) per identity, so a
restarted site never takes part twice in one masked round.

A contribution is recorded *before* the site trains for the round (charge before release), in one
transaction that refuses a round whose update already went into an aggregation (a replayed round)
and a contribution beyond the plan's number of rounds. A round recorded but whose update no setup
ever consumed may be trained again (a resumed coordinator re-runs the round its crash interrupted):
the round stays one contribution, and it is trained at most :data:`MAX_TRAININGS` times (counted
in the same transaction, on disk), so no coordinator, resumed or lying about it, gets an unbounded
number of trainings of one round. So a coordinator that restarts, replays rounds or runs more
rounds than the plan says cannot make the site release more than one update per round and the
plan's rounds, whose epsilon the ledger reserved when the site accepted the plan.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from fedsec.network.errors import PolicyRefused
from fedsec.state.durable import open_durable, transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (run_id TEXT PRIMARY KEY, plan TEXT NOT NULL, accepted_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contributions (run_id TEXT NOT NULL, round INTEGER NOT NULL,
    at TEXT NOT NULL, PRIMARY KEY (run_id, round));
CREATE TABLE IF NOT EXISTS consumed (run_id TEXT NOT NULL, kind TEXT NOT NULL, round INTEGER NOT NULL,
    at TEXT NOT NULL, PRIMARY KEY (run_id, kind, round));
CREATE TABLE IF NOT EXISTS trainings (run_id TEXT NOT NULL, round INTEGER NOT NULL,
    count INTEGER NOT NULL, PRIMARY KEY (run_id, round));
CREATE TABLE IF NOT EXISTS sessions (identity BLOB NOT NULL, session BLOB NOT NULL, round INTEGER NOT NULL,
    PRIMARY KEY (identity, session, round));
CREATE TABLE IF NOT EXISTS late_setups (run_id TEXT NOT NULL, round INTEGER NOT NULL,
    count INTEGER NOT NULL, PRIMARY KEY (run_id, round));
CREATE TABLE IF NOT EXISTS late_update_setups (run_id TEXT NOT NULL, round INTEGER NOT NULL,
    count INTEGER NOT NULL, PRIMARY KEY (run_id, round));
"""


MAX_LATE_SETUPS = 3
"""Most sums of one (plan, round) and kind (evaluation, update) a site sets up before its input
exists (the barrier cut's late evaluation input; the update's keys agreed during the round before):
the first and two more for a coordinator that resumed twice inside the round
(review 8b: unbounded, each one a durable ``sessions`` row; as :data:`MAX_TRAININGS` bounds
retrains)."""
_LATE_TABLES = {"evaluation": "late_setups", "update": "late_update_setups"}
"""Where :meth:`SiteState.late_setup` counts each kind (the evaluation's table is session 8's)."""
MAX_TRAININGS = 3
"""Most trainings of one (plan, round) a site runs: the first and two retrains for a coordinator
that resumed twice inside the round. Each training's answer is data-independent under DP (a failed
training is a zero update answered ``ok``, :meth:`fedsec.network.site_work.SiteWork.train`), and
only one of a round's updates can be consumed; the bound is the depth behind that: whatever a
training might still leak (its timing, a crash), a coordinator crash-looping or pretending to
resume gets it at most three times a round, then ``rounds.retrained`` for that round (the
operator sees it in the audit log and the coordinator can run the next round)."""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


class SiteState:
    """A site's accepted plans and contributions in ``state_dir/site.db`` (created if missing)."""

    def __init__(self, state_dir: str | Path) -> None:
        directory = Path(state_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self._db = open_durable(directory / "site.db", schema=_SCHEMA)

    def accept(self, run_id: str, plan: str) -> None:
        """Record the plan text of ``run_id`` (its SHA-256); accepting it again changes nothing."""
        with transaction(self._db):
            self._db.execute("INSERT OR IGNORE INTO plans VALUES (?, ?, ?)", (run_id, plan, _now()))

    def plans(self) -> list[str]:
        return [r for (r,) in self._db.execute("SELECT run_id FROM plans ORDER BY rowid")]

    def contributed(self, run_id: str) -> list[int]:
        return [r for (r,) in self._db.execute(
            "SELECT round FROM contributions WHERE run_id = ? ORDER BY round", (run_id,))]

    def contribute(self, run_id: str, round_index: int, *, max_rounds: int) -> int:
        """Record a contribution to round ``round_index`` (>= 1) of ``run_id``; returns how many
        rounds of the run it has contributed to, this one included.

        A round already recorded may be trained again (a resumed coordinator re-runs the round
        its crash interrupted) iff the site's update of that round was never consumed (no layer
        setup named it, :meth:`consume`): nothing that depends on the first training has left
        the site, and at most one of its round-``round_index`` updates can ever be consumed. The
        count does not grow (the round is charged once). A round is trained at most
        :data:`MAX_TRAININGS` times.

        Raises:
            PolicyRefused: ``rounds.replayed`` (this round's update already went into an
                aggregation), ``rounds.retrained`` (this round was trained :data:`MAX_TRAININGS`
                times already), or ``rounds.plan`` (the plan's ``max_rounds`` contributions are
                done), or ``rounds.invalid`` (a round outside [1, max_rounds]).
        """
        if isinstance(round_index, bool) or not isinstance(round_index, int) \
                or not 1 <= round_index <= max_rounds:
            raise PolicyRefused("rounds.invalid", f"round {round_index!r} is outside the plan's "
                                                  f"1..{max_rounds}")
        with transaction(self._db):
            done = self._db.execute("SELECT COUNT(*) FROM contributions WHERE run_id = ?",
                                    (run_id,)).fetchone()[0]
            if self._db.execute("SELECT 1 FROM contributions WHERE run_id = ? AND round = ?",
                                (run_id, round_index)).fetchone():
                if self._db.execute("SELECT 1 FROM consumed WHERE run_id = ? AND kind = 'update' "
                                    "AND round = ?", (run_id, round_index)).fetchone():
                    raise PolicyRefused("rounds.replayed", f"this site's update of round {round_index} "
                                                           f"already went into an aggregation")
                row = self._db.execute("SELECT count FROM trainings WHERE run_id = ? AND round = ?",
                                       (run_id, round_index)).fetchone()
                trained = 1 if row is None else int(row[0])  # a site.db from before the count: 1
                if trained >= MAX_TRAININGS:
                    raise PolicyRefused("rounds.retrained", f"this site trained round {round_index} "
                                                            f"{trained} times, the most it trains one round")
                self._db.execute("INSERT OR REPLACE INTO trainings VALUES (?, ?, ?)",
                                 (run_id, round_index, trained + 1))
                return done
            if done >= max_rounds:
                raise PolicyRefused("rounds.plan",
                                    f"this site has contributed the plan's {max_rounds} rounds")
            self._db.execute("INSERT INTO contributions VALUES (?, ?, ?)", (run_id, round_index, _now()))
            self._db.execute("INSERT OR REPLACE INTO trainings VALUES (?, ?, 1)", (run_id, round_index))
        return done + 1

    def used(self, run_id: str, kind: str, round_index: int) -> bool:
        """Whether the contribution (``kind``, ``round_index``) of ``run_id`` went into an aggregation."""
        return self._db.execute("SELECT 1 FROM consumed WHERE run_id = ? AND kind = ? AND round = ?",
                                (run_id, kind, int(round_index))).fetchone() is not None

    def consume(self, run_id: str, kind: str, round_index: int) -> None:
        """Record, before anything that depends on it leaves, that the site's contribution
        (``kind``: update, evaluation, moments-1, moments-2; ``round_index``) of ``run_id`` goes
        into an aggregation. Keyed by the run (plan SHA-256), never by a session id or sequence
        number the coordinator picks, and kept across restarts.

        Raises:
            PolicyRefused: ``contribution.used`` (it already went into one).
        """
        with transaction(self._db):
            cursor = self._db.execute("INSERT OR IGNORE INTO consumed VALUES (?, ?, ?, ?)",
                                      (run_id, kind, int(round_index), _now()))
        if cursor.rowcount != 1:
            raise PolicyRefused("contribution.used", f"this site's {kind} contribution of round "
                                                     f"{round_index} already went into an aggregation")

    def record(self, run_id: str) -> RunRecord:
        """The durable record of ``run_id``'s consumed contributions (for :class:`SiteWork`)."""
        return RunRecord(self, run_id)

    def late_setup(self, run_id: str, round_index: Any, *, max_rounds: int,
                   kind: str = "evaluation") -> str | None:
        """Count one sum of ``round_index`` set up before its input exists (``kind``: an
        ``evaluation``'s, or an ``update``'s whose keys were agreed during the round before); the
        reason it is refused instead (nothing counted): a round outside the plan's
        1..``max_rounds``, that round's contribution of ``kind`` already consumed, or
        :data:`MAX_LATE_SETUPS` of that kind and round set up already."""
        if kind not in _LATE_TABLES:
            raise ValueError(f"no late setups of kind {kind!r}")
        if isinstance(round_index, bool) or not isinstance(round_index, int) \
                or not 1 <= round_index <= max_rounds:  # the coordinator's value, shown cut short
            return f"round {repr(round_index)[:40]} is outside the plan's 1..{max_rounds}"
        table = _LATE_TABLES[kind]
        with transaction(self._db):
            if self._db.execute("SELECT 1 FROM consumed WHERE run_id = ? AND kind = ? AND round = ?",
                                (run_id, kind, round_index)).fetchone():
                return f"this site's {kind} of round {round_index} already went into an aggregation"
            row = self._db.execute(f"SELECT count FROM {table} WHERE run_id = ? AND round = ?",
                                   (run_id, round_index)).fetchone()
            count = 0 if row is None else int(row[0])
            if count >= MAX_LATE_SETUPS:
                return (f"this site set up {count} sums of its {kind} of round {round_index} before "
                        f"their input, the most it sets up")
            self._db.execute(f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?)",
                             (run_id, round_index, count + 1))
        return None

    def claim(self, identity: bytes, session: bytes, round_index: int) -> bool:
        """The masked protocol's session record (:mod:`fedsec.protocols.masked.sessions`), on
        disk: False when this identity already took part in (session, round), also before a
        restart."""
        with transaction(self._db):
            cursor = self._db.execute("INSERT OR IGNORE INTO sessions VALUES (?, ?, ?)",
                                      (bytes(identity), bytes(session), int(round_index)))
        return cursor.rowcount == 1

    def close(self) -> None:
        self._db.close()


class RunRecord:
    """One run's consumed contributions in ``site.db`` (see :meth:`SiteState.consume`)."""

    def __init__(self, state: SiteState, run_id: str) -> None:
        self.state, self.run_id = state, run_id

    def used(self, kind: str, round_index: int) -> bool:
        return self.state.used(self.run_id, kind, round_index)

    def consume(self, kind: str, round_index: int) -> None:
        self.state.consume(self.run_id, kind, round_index)
