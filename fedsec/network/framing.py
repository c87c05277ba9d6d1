"""Chunked framing of one payload as a stream of gRPC messages.

A payload travels as a header message followed by chunk messages:

    header = b"FSX2" | length (u64 big-endian, bytes) | digest (32 bytes)
             | topic length (u16 big-endian) | topic (UTF-8, 1-255 bytes)
    digest = SHA-256(topic length | topic | SHA-256(payload))
    chunk  = the next min(CHUNK_BYTES, remaining) bytes of the payload

The receiver refuses (``MalformedFrame``, a ``ValueError``) a header above its size limit before
reading any chunk, and allocates nothing on the header's word: its buffer grows with the bytes that
arrive (never past the announced length), so a peer that announces 256 MiB and sends nothing costs
nothing. It refuses a chunk longer than ``CHUNK_BYTES``, more or fewer bytes than announced, and a
digest mismatch. TLS already protects the stream against a network attacker; the digest binds the
topic to the payload and catches truncation or a bug on either end. No single gRPC message is
larger than ``CHUNK_BYTES``, so gRPC's message-size limits
stay small and explicit however large the model.

The digest covers the payload through its own SHA-256, the digest the audit logs record of every
message: a :class:`Payload` keeps it once computed, so each end hashes a message once (the framing
and the audit row share it; ``FSX1`` hashed the payload itself, so each end hashed it twice).

A payload whose header and bytes fit in one gRPC message may instead travel as a *single*
message, ``header | payload`` (:func:`single`, read with :func:`unpack`): the same header, the
same checks, no chunk messages. The transport uses it for its unary fast path.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator

from fedsec.network.errors import MalformedFrame

MAGIC = b"FSX2"
CHUNK_BYTES = 1 << 20
"""Payload bytes per gRPC message (1 MiB)."""
HEADER_MAX = len(MAGIC) + 8 + 32 + 2 + 255
MESSAGE_MAX = CHUNK_BYTES + 1024
"""The gRPC send/receive message limit both ends set (a chunk or a header, with room to spare)."""
DEFAULT_MAX_PAYLOAD = 256 << 20
"""Largest payload a receiver accepts by default (256 MiB: 64M float32 parameters)."""
_FIXED = struct.Struct(">4sQ32sH")


class Payload(bytes):
    """The bytes of one message with its SHA-256 computed at most once (:meth:`sha256`)."""

    def sha256(self) -> bytes:
        """SHA-256 of the bytes (32 bytes), computed on the first call."""
        digest = self.__dict__.get("_sha256")
        if digest is None:
            digest = self.__dict__["_sha256"] = hashlib.sha256(self).digest()
        return digest

    @classmethod
    def known(cls, data: bytes | bytearray | memoryview, sha256: bytes) -> Payload:
        """``data`` as a payload whose SHA-256 the caller has just computed (``sha256``)."""
        payload = cls(data)
        payload.__dict__["_sha256"] = sha256
        return payload


def payload_sha256(payload: bytes | bytearray | memoryview) -> bytes:
    """SHA-256 of ``payload`` (the one a :class:`Payload` keeps, else computed now)."""
    return payload.sha256() if isinstance(payload, Payload) else hashlib.sha256(payload).digest()


def _digest(topic: bytes, payload_digest: bytes) -> bytes:
    return hashlib.sha256(len(topic).to_bytes(2, "big") + topic + payload_digest).digest()


def frames(topic: str, payload: bytes | bytearray | memoryview) -> Iterator[bytes]:
    """The header, then the payload in chunks of at most :data:`CHUNK_BYTES`."""
    name = topic.encode()
    if not 1 <= len(name) <= 255:
        raise ValueError("topic: must be 1-255 bytes of UTF-8")
    view = memoryview(payload).cast("B")
    yield _FIXED.pack(MAGIC, len(view), _digest(name, payload_sha256(payload)), len(name)) + name
    for start in range(0, len(view), CHUNK_BYTES):
        yield bytes(view[start:start + CHUNK_BYTES])


def single(topic: str, payload: bytes | bytearray | memoryview) -> bytes | None:
    """The header and the payload as one message, or None when that exceeds :data:`MESSAGE_MAX`."""
    name = topic.encode()
    if not 1 <= len(name) <= 255:
        raise ValueError("topic: must be 1-255 bytes of UTF-8")
    view = memoryview(payload).cast("B")
    if _FIXED.size + len(name) + len(view) > MESSAGE_MAX:
        return None
    return b"".join((_FIXED.pack(MAGIC, len(view), _digest(name, payload_sha256(payload)), len(name)), name,
                     view))


def _header(message: bytes, *, max_payload: int) -> tuple[str, int, bytes, int]:
    """``(topic, announced length, digest, header size)`` of the header at the start of ``message``."""
    if len(message) < _FIXED.size:
        raise MalformedFrame("frame header: missing or of the wrong size")
    magic, length, digest, topic_len = _FIXED.unpack_from(message)
    size = _FIXED.size + topic_len
    if magic != MAGIC or topic_len == 0 or len(message) < size:
        raise MalformedFrame("frame header: not a fedsec frame")
    try:
        topic = message[_FIXED.size:size].decode()
    except UnicodeDecodeError:
        raise MalformedFrame("frame header: topic is not UTF-8") from None
    if length > max_payload:
        raise MalformedFrame(f"frame header: payload of {length} bytes exceeds the limit of {max_payload}")
    return topic, length, digest, size


def unpack(messages: Iterable[bytes], *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> tuple[str, Payload]:
    """Read one :func:`single` message from ``messages`` (exactly one); returns ``(topic, payload)``
    (its SHA-256 kept).

    Raises:
        MalformedFrame: no message or more than one, a bad header, a payload over ``max_payload``
            bytes, a length or SHA-256 mismatch.
    """
    stream = iter(messages)
    message = next(stream, None)
    if message is None or len(message) > MESSAGE_MAX:
        raise MalformedFrame("frame: missing or larger than one message")
    topic, length, digest, size = _header(message, max_payload=max_payload)
    view = memoryview(message)[size:]
    if len(view) != length:
        raise MalformedFrame(f"frame: {len(view)} of {length} announced bytes arrived")
    own = hashlib.sha256(view).digest()
    if _digest(message[_FIXED.size:size], own) != digest:
        raise MalformedFrame("frame: SHA-256 mismatch")
    if next(stream, None) is not None:
        raise MalformedFrame("frame: more than one message")
    return topic, Payload.known(view, own)


def reassemble(messages: Iterable[bytes], *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> tuple[str, Payload]:
    """Read one framed payload from ``messages``; returns ``(topic, payload)`` (its SHA-256 kept).

    Raises:
        MalformedFrame: a bad header, a payload over ``max_payload`` bytes, an oversized chunk,
            a length or SHA-256 mismatch.
    """
    stream = iter(messages)
    header = next(stream, None)
    if header is None or len(header) < _FIXED.size or len(header) > HEADER_MAX:
        raise MalformedFrame("frame header: missing or of the wrong size")
    topic, length, digest, size = _header(header, max_payload=max_payload)
    if len(header) != size:
        raise MalformedFrame("frame header: not a fedsec frame")
    buffer = bytearray()
    for chunk in stream:
        if len(chunk) > CHUNK_BYTES or len(buffer) + len(chunk) > length:
            raise MalformedFrame("frame: more bytes than announced or an oversized chunk")
        buffer += chunk
    if len(buffer) != length:
        raise MalformedFrame(f"frame: {len(buffer)} of {length} announced bytes arrived")
    own = hashlib.sha256(buffer).digest()
    if _digest(header[_FIXED.size:], own) != digest:
        raise MalformedFrame("frame: SHA-256 mismatch")
    return topic, Payload.known(buffer, own)
