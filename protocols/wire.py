"""A small canonical binary codec for protocol messages (big-endian, length-prefixed, no pickle).

Every read is bounds-checked; anything short, long or out of range raises
:class:`protocols.errors.MalformedMessage`.
"""

from __future__ import annotations

import struct

import numpy as np
from fedsec.protocols.errors import MalformedMessage

MAX_LIST = 1 << 20
MAX_BLOB = 1 << 31


class Writer:
    """Appends fields to a byte buffer."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, value: int) -> Writer:
        self._parts.append(struct.pack(">B", value))
        return self

    def u32(self, value: int) -> Writer:
        self._parts.append(struct.pack(">I", value))
        return self

    def u64(self, value: int) -> Writer:
        self._parts.append(struct.pack(">Q", value))
        return self

    def f64(self, value: float) -> Writer:
        self._parts.append(struct.pack(">d", value))
        return self

    def fixed(self, data: bytes, size: int) -> Writer:
        if len(data) != size:
            raise MalformedMessage(f"field must be {size} bytes, got {len(data)}")
        self._parts.append(data)
        return self

    def blob(self, data: bytes) -> Writer:
        self.u32(len(data))
        self._parts.append(data)
        return self

    def records(self, layout: struct.Struct, rows: list | tuple) -> Writer:
        """A count, then fixed-size records packed with ``layout`` (one per row)."""
        self.u32(len(rows))
        try:
            self._parts.append(b"".join(layout.pack(*row) for row in rows))
        except struct.error as error:
            raise MalformedMessage(f"a record does not fit its layout: {error}") from None
        return self

    def ids(self, values: list[int] | tuple[int, ...]) -> Writer:
        self.u32(len(values))
        self._parts.append(struct.pack(f">{len(values)}Q", *values))
        return self

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Reads fields from bytes, refusing anything out of bounds."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data).toreadonly()
        self._pos = 0

    def _take(self, size: int) -> memoryview:
        if size < 0 or self._pos + size > len(self._data):
            raise MalformedMessage("message is truncated")
        view = self._data[self._pos : self._pos + size]
        self._pos += size
        return view

    def u8(self) -> int:
        return self._take(1)[0]

    def u32(self) -> int:
        return struct.unpack(">I", self._take(4))[0]

    def u64(self) -> int:
        return struct.unpack(">Q", self._take(8))[0]

    def f64(self) -> float:
        return struct.unpack(">d", self._take(8))[0]

    def fixed(self, size: int) -> bytes:
        return bytes(self._take(size))

    def view(self) -> memoryview:
        """A length-prefixed blob as a read-only view into the message (no copy)."""
        size = self.u32()
        if size > MAX_BLOB:
            raise MalformedMessage("blob too large")
        return self._take(size)

    def count(self) -> int:
        n = self.u32()
        if n > MAX_LIST:
            raise MalformedMessage("list too long")
        return n

    def records(self, layout: struct.Struct) -> list[tuple]:
        """A count, then that many fixed-size records unpacked with ``layout``."""
        n = self.count()
        return list(layout.iter_unpack(self._take(n * layout.size))) if n else []

    def record_array(self, dtype: np.dtype) -> np.ndarray:
        """A count, then that many fixed-size records as a read-only structured array over the
        message's bytes (no copy, no object per record): the bytes :meth:`records` reads."""
        n = self.count()
        return np.frombuffer(self._take(n * dtype.itemsize), dtype=dtype)

    def ids(self) -> tuple[int, ...]:
        n = self.count()
        return struct.unpack(f">{n}Q", self._take(8 * n))

    def end(self) -> None:
        if self._pos != len(self._data):
            raise MalformedMessage("trailing bytes after the message")


def start_envelope(magic: bytes, version: int, kind: int) -> Writer:
    """A writer that has written the envelope of one message: 4-byte magic, version, kind."""
    return Writer().fixed(magic, 4).u8(version).u8(kind)


def open_envelope(data: bytes, magic: bytes, version: int, kind: int, *, family: str,
                  name: str) -> Reader:
    """A reader past the envelope of ``data``, which must be bytes of the ``family`` protocol
    (magic and version) and a ``name`` message (kind); else MalformedMessage."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedMessage("a message must be bytes")
    r = Reader(bytes(data))
    if r.fixed(4) != magic or r.u8() != version:
        raise MalformedMessage(f"not a fedsec {family} message (magic or version)")
    if r.u8() != kind:
        raise MalformedMessage(f"expected a {name} message")
    return r
