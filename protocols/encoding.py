"""What every privacy layer does to client updates before its cryptography: validation at the
seam, and the fixed-point encoder for each purpose (model updates or feature statistics).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fl_core.aggregation import ClientUpdate, Purpose
from fl_core.errors import InvalidParameterError
from protocols.errors import ProtocolAbort
from secagg.encoding import MAX_MODULUS_BITS, FixedPointEncoder

STATISTICS_CLIP = float(2**24)
"""Range of feature statistics (means, centred second moments) sent with purpose='statistics'."""

MAX_CLIENT_ID = 2**64 - 2
"""Client ids are u64 on the wire; 2^64 - 1 names the server."""


def check_layer_arguments(*, max_weight: int, clip: float, bits: int, dropout: float) -> None:
    """Up-front checks of the arguments every aggregation layer takes (InvalidParameterError)."""
    if max_weight < 1:
        raise InvalidParameterError(f"max_weight must be >= 1, got {max_weight}")
    if not (math.isfinite(clip) and clip > 0):
        raise InvalidParameterError(f"clip must be a finite number > 0, got {clip}")
    if not 1 <= bits <= 32:
        raise InvalidParameterError(f"bits must be in [1, 32], got {bits}")
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


def validate_updates(updates: Sequence[ClientUpdate], max_weight: int
                     ) -> tuple[list[ClientUpdate], list[int]]:
    """Split updates into (usable, ids of rejected): a usable one is a finite, non-empty 1-D array
    from a valid client id with an integer weight in [1, max_weight], as long as the others."""
    valid, rejected = [], []
    for u in updates:
        v = u.vector
        ok = (isinstance(v, np.ndarray) and v.ndim == 1 and v.size >= 1 and np.isfinite(v).all()
              and 0 <= u.client_id <= MAX_CLIENT_ID and float(u.weight).is_integer()
              and 1 <= u.weight <= max_weight)
        if ok:
            valid.append(u)
        else:
            rejected.append(u.client_id)
    if valid:
        length = valid[0].vector.size
        if any(u.vector.size != length for u in valid):
            raise ProtocolAbort("client updates differ in length")
    return valid, rejected
