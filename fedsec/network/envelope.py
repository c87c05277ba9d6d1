"""One message between the coordinator and a site: a JSON header and an opaque binary body.

    envelope = b"FSJ1" | header length (u32 big-endian) | header (canonical JSON object, UTF-8)
               | body (the rest: a model vector as little-endian float32, or a protocol's
               canonical message bytes)

No pickle: the header is JSON (objects, strings, numbers, booleans, lists) and the body is bytes
the receiver parses with its own strict codec. :func:`decode` refuses (``MalformedEnvelope``, a
``ValueError``) a wrong magic, a header longer than ``HEADER_LIMIT`` or than the envelope, a header
that is not a JSON object, and a header over the limit is refused before it is parsed.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

MAGIC = b"FSJ1"
HEADER_LIMIT = 1 << 20
"""Largest JSON header in bytes (1 MiB: a roster of certificates fits many times over)."""
_LENGTH = struct.Struct(">I")


class MalformedEnvelope(ValueError):
    """A coordinator-site message that does not parse (never says more than what is wrong)."""


def encode(header: dict[str, Any], body: bytes = b"") -> bytes:
    """The envelope of ``header`` (a JSON object of finite values) and ``body``."""
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    if len(text) > HEADER_LIMIT:
        raise ValueError("header: over the envelope's header limit")
    return MAGIC + _LENGTH.pack(len(text)) + text + bytes(body)


def decode(data: bytes) -> tuple[dict[str, Any], bytes]:
    """``(header, body)`` of an envelope; raises :class:`MalformedEnvelope`."""
    if len(data) < len(MAGIC) + _LENGTH.size or data[:len(MAGIC)] != MAGIC:
        raise MalformedEnvelope("not an envelope")
    (size,) = _LENGTH.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if size > HEADER_LIMIT or start + size > len(data):
        raise MalformedEnvelope("header length out of range")
    try:
        header = json.loads(data[start:start + size].decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise MalformedEnvelope("header is not JSON") from None
    if not isinstance(header, dict):
        raise MalformedEnvelope("header is not a JSON object")
    return header, bytes(data[start + size:])


def field(header: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``header[key]`` if present and of ``kind`` (bool is not an int); else MalformedEnvelope."""
    value = header.get(key)
    if value is None or isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise MalformedEnvelope(f"header field {key!r} missing or of the wrong type")
    return value


def vector_bytes(vector: np.ndarray) -> bytes:
    """A float32 vector as little-endian bytes."""
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


def vector_from(body: bytes, length: int) -> np.ndarray:
    """``length`` little-endian float32 values, finite; else MalformedEnvelope."""
    if len(body) != 4 * length:
        raise MalformedEnvelope(f"vector has {len(body)} bytes, expected {4 * length}")
    vector = np.frombuffer(body, dtype="<f4").astype(np.float32)
    if not np.isfinite(vector).all():
        raise MalformedEnvelope("vector holds NaN or infinite values")
    return vector
