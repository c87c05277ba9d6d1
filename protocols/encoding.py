"""What every privacy layer does to client updates before its cryptography: validation at the
seam, and the fixed-point encoder for each purpose (model updates or feature statistics).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import numpy as np
from fedsec.fl_core.aggregation import ClientUpdate, Purpose
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.protocols.errors import ProtocolAbort
from fedsec.secagg.encoding import MAX_MODULUS_BITS, FixedPointEncoder, clip_range

STATISTICS_CLIP = float(2**24)
"""Range of feature statistics (means, centred second moments) sent with purpose='statistics'."""

MAX_CLIENT_ID = 2**64 - 2
"""Client ids are u64 on the wire; 2^64 - 1 names the server."""


def check_layer_arguments(*, max_weight: int, clip: float, bits: int, dropout: float) -> None:
    """Up-front checks of the arguments every aggregation layer takes (InvalidParameterError).

    The clip must lie in :func:`secagg.encoding.clip_range` for the bits and the widest (64-bit)
    modulus: e.g. [1.46e-303, 2.44e288] at 16 bits. Outside it a clip passes as a number but
    cannot be encoded (1e308 decodes to NaN, 1e-310 turns every value into +-clip)."""
    if isinstance(max_weight, bool) or not isinstance(max_weight, numbers.Integral) or max_weight < 1:
        raise InvalidParameterError(f"max_weight must be an integer >= 1, got {max_weight!r}")
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 1 <= bits <= 32:
        raise InvalidParameterError(f"bits must be an integer in [1, 32], got {bits!r}")
    lo, hi = clip_range(int(bits), MAX_MODULUS_BITS)
    if (isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not math.isfinite(clip)
            or not lo <= clip <= hi):
        raise InvalidParameterError(f"clip must be a number in [{lo:.6g}, {hi:.6g}] (what {bits}-bit "
                                    f"values summed in a word of up to {MAX_MODULUS_BITS} bits can "
                                    f"encode and decode), got {clip!r}")
    if not 0 <= dropout < 1:
        raise InvalidParameterError(f"dropout must be in [0, 1), got {dropout}")


class ShiftedNoise(Protocol):
    """Integer noise that clients add to their encoded value words, shifted to be non-negative:
    every value ``draw`` returns lies in [0, ``slack``] and has mean ``offset``; the protocol
    subtracts (number of contributions) x ``offset`` from the sum before decoding."""

    offset: int
    slack: int

    def draw(self, length: int) -> np.ndarray:
        """``length`` shifted noise values (int64)."""


def remove_offsets(total: np.ndarray, contributions: int, noise: ShiftedNoise | None) -> np.ndarray:
    """The decoded-ready sum: value words minus the noise shifts (signed int64 from here on)."""
    if noise is None:
        return total
    out = total.astype(np.int64)
    out[:-2] -= contributions * noise.offset
    return out


def encoder_for(purpose: Purpose, *, clients: int, length: int, max_weight: int, clip: float,
                bits: int, noise: ShiftedNoise | None = None) -> FixedPointEncoder:
    """The encoder for one aggregation of ``clients`` vectors of ``length`` values.

    Updates use the configured clip and bits, with room for ``noise``; statistics use a clip of
    2^24 and as many bits as a 64-bit word leaves after the headroom for ``clients`` x
    ``max_weight`` (at least 16), and never carry noise.
    """
    if purpose == "update":
        return FixedPointEncoder(clip=clip, bits=bits, max_clients=clients, max_weight=max_weight,
                                 max_length=length, word_slack=noise.slack if noise else 0)
    headroom = (clients * max_weight).bit_length()
    stat_bits = min(48, MAX_MODULUS_BITS - headroom)
    if stat_bits < 16:
        raise ProtocolAbort("statistics: too many clients x weight for a 64-bit word")
    return FixedPointEncoder(clip=STATISTICS_CLIP, bits=stat_bits, max_clients=clients,
                             max_weight=max_weight, max_length=length)


@dataclasses.dataclass(frozen=True)
class Rejection:
    """An update refused at the seam: the id as the caller gave it and why."""

    client_id: object
    reason: str


NOT_AN_ID = "client id is not an integer in [0, 2^64 - 2]"
DUPLICATE_ID = "client id appears more than once in this call"
BAD_VECTOR = "update is not a non-empty 1-D array of real numbers"
NOT_FINITE = "update holds NaN or infinite values"
BAD_WEIGHT = "weight is not an integer in [1, max_weight]"
WRONG_LENGTH = "update length differs from the other updates'"


def _is_id(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, numbers.Integral)
            and 0 <= int(value) <= MAX_CLIENT_ID)


def _vector_problem(vector: object) -> str | None:
    if (not isinstance(vector, np.ndarray) or np.ma.isMaskedArray(vector) or vector.ndim != 1
            or vector.size < 1 or vector.dtype.kind not in "fiu"):
        return BAD_VECTOR
    if vector.dtype.kind == "f":
        if not np.isfinite(vector).all():
            return NOT_FINITE
        if vector.dtype.itemsize > 8:
            with np.errstate(over="ignore"):
                if not np.isfinite(vector.astype(np.float64)).all():
                    return NOT_FINITE  # finite in extended precision, infinite as the float64 encoded
    return None


def _is_weight(value: object, max_weight: int) -> bool:
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        return False
    if isinstance(value, numbers.Integral):
        return 1 <= int(value) <= max_weight
    try:
        w = float(value)
    except (OverflowError, ValueError, TypeError):
        return False
    return math.isfinite(w) and w.is_integer() and 1 <= w <= max_weight


def validate_updates(updates: Sequence[ClientUpdate], max_weight: int
                     ) -> tuple[list[ClientUpdate], list[Rejection]]:
    """Split updates into (usable, rejected); nothing is dropped without a :class:`Rejection`.

    A usable update has an integer client id in [0, 2^64 - 2] that no other update of the call
    carries (every copy of a repeated id is rejected: which one is genuine cannot be told), a
    non-empty 1-D float or integer array with no NaN or inf, an integer weight in
    [1, max_weight] (bool and strings are not weights), and the length most updates have. Usable
    updates come back with ``client_id`` and ``weight`` as Python ints.

    Raises:
        ProtocolAbort: two or more lengths tie for the most common one (no length to trust).
    """
    checked: list[tuple[ClientUpdate, str | None]] = []
    for u in updates:
        problem = None
        if not _is_id(u.client_id):
            problem = NOT_AN_ID
        else:
            problem = _vector_problem(u.vector)
            if problem is None and not _is_weight(u.weight, max_weight):
                problem = BAD_WEIGHT
        checked.append((u, problem))
    ids = Counter(int(u.client_id) for u, problem in checked if problem != NOT_AN_ID)
    checked = [(u, DUPLICATE_ID if problem != NOT_AN_ID and ids[int(u.client_id)] > 1 else problem)
               for u, problem in checked]
    lengths = Counter(u.vector.size for u, problem in checked if problem is None)
    if lengths:
        (length, most), *rest = lengths.most_common()
        if rest and rest[0][1] == most:
            raise ProtocolAbort(f"client updates disagree on the length: {sorted(lengths)} tie "
                                "for the most common one")
        checked = [(u, WRONG_LENGTH if problem is None and u.vector.size != length else problem)
                   for u, problem in checked]
    valid = [dataclasses.replace(u, client_id=int(u.client_id), weight=int(u.weight))
             for u, problem in checked if problem is None]
    rejected = [Rejection(u.client_id, problem) for u, problem in checked if problem is not None]
    return valid, rejected
