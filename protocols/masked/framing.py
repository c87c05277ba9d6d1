"""The server's messages built from parts serialised once.

A server stage sends every client a message that shares most of its bytes with the others: the
session parameters and the survivor list are the same for all; a key entry goes to k + 1 clients;
the survivor-list signatures go to every survivor. The builders here serialise each shared part
once and only frame it per recipient, giving exactly the bytes of
:func:`protocols.masked.messages.encode` on the corresponding message (tests/protocols/masked
checks byte equality against it).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import numpy as np
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.masked import messages as m
from fedsec.protocols.wire import Writer

_HEADER = struct.Struct(f">4sB{m.SESSION_BYTES}sQQQ")
_COUNT = struct.Struct(">I")


def frame(kind: int, session: bytes, round_index: int, recipient: int,
          body: bytes | Sequence[bytes]) -> bytes:
    """The server's message of ``kind`` to ``recipient``: header, then the serialised ``body``
    (bytes, or parts joined in order)."""
    if len(session) != m.SESSION_BYTES:
        raise MalformedMessage(f"field must be {m.SESSION_BYTES} bytes, got {len(session)}")
    header = _HEADER.pack(m.MAGIC, kind, session, round_index, m.SERVER, recipient)
    if isinstance(body, bytes | bytearray | memoryview):
        return header + body
    return b"".join((header, *body))


def body_bytes(body: m.Body) -> bytes:
    """The serialised body of a message (what follows the header)."""
    w = Writer()
    body.write(w)
    return w.getvalue()


def ids_bytes(ids: Sequence[int] | np.ndarray) -> bytes:
    """A list of u64 ids as :meth:`protocols.wire.Writer.ids` writes it."""
    return _COUNT.pack(len(ids)) + np.asarray(ids, dtype=">u8").tobytes()


class KeyListBodies:
    """KeyList bodies from key entries packed once each.

    Args:
        entries: the accepted key entries by client, all signed or all unsigned.
    """

    def __init__(self, entries: Mapping[int, m.KeyEntry]) -> None:
        signed = {bool(e.signature) for e in entries.values()}
        if len(signed) > 1:
            raise MalformedMessage("key entries must all be signed or all unsigned")
        self._flag = b"\x01" if signed == {True} else b"\x00"
        self._records = {c: body_bytes(m.KeyList((e,)))[5:] for c, e in entries.items()}

    def body(self, clients: Sequence[int]) -> list[bytes]:
        """The body of KeyList([entries[c] for c in clients]), as parts."""
        flag = self._flag if clients else b"\x00"  # an empty list counts as unsigned
        return [flag, _COUNT.pack(len(clients)), *(self._records[c] for c in clients)]


class UnmaskRequestBodies:
    """UnmaskRequest bodies whose signature list (the same for every recipient) and partner
    attestations (each sent to many) are packed once.

    Args:
        signatures: (signer, signature) pairs, in the order they are sent.
        attestations: owner -> (partner bitmap, signature); all bitmaps one size.
    """

    def __init__(self, signatures: Sequence[tuple[int, bytes]],
                 attestations: Mapping[int, tuple[bytes, bytes]]) -> None:
        self._signatures = body_bytes(m.UnmaskRequest((), (), tuple(signatures), ()))[8:-8]
        sizes = {len(bits) for bits, _ in attestations.values()}
        if len(sizes) > 1:
            raise MalformedMessage("attestation bitmaps differ in size")
        self._attestations = attestations
        self._records: dict[int, bytes] = {}

    def _record(self, owner: int) -> bytes:
        record = self._records.get(owner)
        if record is None:
            bits, signature = self._attestations[owner]
            record = self._records[owner] = body_bytes(
                m.UnmaskRequest((), (), (), ((owner, bits, signature),)))[20:]
        return record

    def body(self, alive: Sequence[int], dropped: Sequence[int], attested: Sequence[int]) -> list[bytes]:
        """The body of UnmaskRequest(alive, dropped, signatures, attestations of ``attested``)."""
        size = len(self._attestations[attested[0]][0]) if attested else 0
        return [ids_bytes(alive), ids_bytes(dropped), self._signatures, _COUNT.pack(size),
                _COUNT.pack(len(attested)), *(self._record(v) for v in attested)]
