"""One identity takes part in a (session, round) once.

The server chooses the session id. Were it able to run several copies of one round under the same
session id and round, each honest identity would hold several independent instances (fresh keys,
seed and shares each), and the server could show one instance's key entry to another run, drop
that instance there and rebuild its mask key, while the victim's other partners reveal its seed:
every honest rule counts identities, so no single instance would ever reveal both of its own
secrets, yet the victim's input would be read (second-round review). A client therefore claims
(identity, session, round) before it draws any key, and a second claim is refused.

``PROCESS_SESSIONS`` is the default record, shared by every :class:`MaskedClient` of this process
(one identity = one party); a deployment passes a durable record so that a restart does not forget.
"""

from __future__ import annotations

import threading
from typing import Protocol


class SessionRecord(Protocol):
    """Where a party remembers the (session, round) pairs it took part in."""

    def claim(self, identity: bytes, session: bytes, round_index: int) -> bool:
        """Record the pair for ``identity``; False if it was claimed before (nothing changes)."""


class MemorySessionRecord:
    """The in-process record (thread-safe): forgotten when the process ends."""

    def __init__(self) -> None:
        self._claimed: set[tuple[bytes, bytes, int]] = set()
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> MemorySessionRecord:
        return self  # a copy of a client is the same party: it shares the record

    def claim(self, identity: bytes, session: bytes, round_index: int) -> bool:
        key = (bytes(identity), bytes(session), int(round_index))
        with self._lock:
            if key in self._claimed:
                return False
            self._claimed.add(key)
            return True


PROCESS_SESSIONS = MemorySessionRecord()
"""The record every MaskedClient uses unless it is given another one."""
