"""What the key holder must remember across restarts: the last sequence number it burned per key.

The key holder accepts a decryption request only for the next sequence number after the last one
it burned, and burns that number before it decrypts anything. If it forgot across a restart, a
server could have one aggregation decrypted twice with two different contributor sets and
subtract the sums. :class:`SequenceStore` is the storage seam: :class:`MemorySequenceStore` is
the in-process default (a simulation, or a test); a deployment passes a durable one (the SQLite
store of :mod:`fedsec.state`), which nothing in ``protocols`` knows about.
"""

from __future__ import annotations

from typing import Protocol

from protocols.errors import ProtocolAbort

MAX_SEQUENCE = (1 << 63) - 1
"""Largest sequence number a store must hold (fits a signed 64-bit column)."""


class StaleSequence(ProtocolAbort):
    """A burn that is not exactly the next number after the last burned one (nothing changed)."""


class SequenceStore(Protocol):
    """Durable, atomic "last burned sequence number" per Paillier key id."""

    def last_burned(self, key_id: bytes) -> int:
        """The last sequence number burned under ``key_id`` (0 if none)."""
        ...

    def burn(self, key_id: bytes, sequence: int) -> None:
        """Record ``sequence`` as burned; it must be ``last_burned(key_id) + 1`` (compare and set,
        durable when this returns), else raises StaleSequence and changes nothing."""
        ...


def check_next(last: int, sequence: int) -> None:
    """The rule every store applies inside its transaction."""
    if sequence != last + 1 or not 1 <= sequence <= MAX_SEQUENCE:
        raise StaleSequence(f"sequence {sequence} is not the next after {last}")


class MemorySequenceStore:
    """A :class:`SequenceStore` in memory: lost when the process ends."""

    def __init__(self) -> None:
        self._last: dict[bytes, int] = {}

    def last_burned(self, key_id: bytes) -> int:
        return self._last.get(bytes(key_id), 0)

    def burn(self, key_id: bytes, sequence: int) -> None:
        check_next(self.last_burned(key_id), sequence)
        self._last[bytes(key_id)] = sequence
