"""What a party must remember across restarts: the key holder's last burned sequence number per
key (:class:`SequenceStore`), and a threshold party's one endorsed list per aggregation
(:class:`EndorsementStore`).

The key holder accepts a decryption request only for the next sequence number after the last one
it burned, and burns that number before it decrypts anything. If it forgot across a restart, a
server could have one aggregation decrypted twice with two different contributor sets and
subtract the sums. :class:`SequenceStore` is the storage seam: :class:`MemorySequenceStore` is
the in-process default (a simulation, or a test); a deployment passes a durable one (the SQLite
stores of :mod:`fedsec.state`), which nothing in ``protocols`` knows about. The same holds for
:class:`EndorsementStore` and :class:`MemoryEndorsementStore`.
"""

from __future__ import annotations

from typing import Protocol

from fedsec.protocols.errors import ProtocolAbort

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


class EndorsementConflict(ProtocolAbort):
    """A second, different contributor list for an aggregation already endorsed (nothing changed)."""


class EndorsementStore(Protocol):
    """Durable, atomic "the one contributor list endorsed" per (Paillier key id, sequence number).

    A threshold party records a list here before it signs it or helps decrypt it; a party that
    forgot (a restart, a rebuilt party object) could be made to sign a second list of one
    aggregation, and two lists' sums differ by one honest update.
    """

    def endorsed(self, key_id: bytes, sequence: int) -> bytes | None:
        """The 32-byte list digest recorded for (``key_id``, ``sequence``), or None."""
        ...

    def endorse(self, key_id: bytes, sequence: int, digest: bytes) -> None:
        """Record ``digest`` for (``key_id``, ``sequence``) unless one is recorded: the same digest
        again changes nothing, another raises EndorsementConflict and changes nothing. Durable when
        this returns."""
        ...


def check_endorsement(sequence: int, digest: bytes) -> None:
    """The form every store checks: sequence in [1, 2^64), a 32-byte digest (ValueError otherwise)."""
    if not 1 <= sequence < 1 << 64:
        raise ValueError(f"sequence: {sequence} is outside [1, 2^64)")
    if not isinstance(digest, bytes) or len(digest) != 32:
        raise ValueError("digest: a list digest is 32 bytes")


class MemoryEndorsementStore:
    """An :class:`EndorsementStore` in memory: lost when the process ends."""

    def __init__(self) -> None:
        self._endorsed: dict[tuple[bytes, int], bytes] = {}

    def endorsed(self, key_id: bytes, sequence: int) -> bytes | None:
        return self._endorsed.get((bytes(key_id), sequence))

    def endorse(self, key_id: bytes, sequence: int, digest: bytes) -> None:
        check_endorsement(sequence, digest)
        if self._endorsed.setdefault((bytes(key_id), sequence), digest) != digest:
            raise EndorsementConflict(f"another list is endorsed for sequence {sequence}")
