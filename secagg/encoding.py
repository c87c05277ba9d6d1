"""The shared fixed-point encoder: float updates to integers mod 2^b whose sum cannot wrap.

A client's update x (length m) with integer weight w becomes m + 2 words:

    q_i = stochastic_round((clip(x_i, -c, c) + c) / (2c) * L),  L = 2^bits - 1,  q_i in [0, L]
    words = [w * q_1, ..., w * q_m, w, number of clipped coordinates]

(offset encoding: no sign bits; the clipped count travels with the update, so behind secure
aggregation the server learns only the total). Summing at most ``max_clients`` such vectors, each
with w <= ``max_weight`` and m <= ``max_length``, gives at most
max_clients * max(max_weight * L, max_length) per word, so the modulus 2^b with b the bit length of
that bound never wraps; a configuration that would need b > 64 is refused up front. Decoding the
sum gives sum_k w_k x_k and sum_k w_k exactly up to quantisation (each word's rounding error is
below 2c/L per unit weight, zero in expectation).
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass

import numpy as np
from fedsec.secagg.errors import EncodingError, InvalidArgumentError, WrapRiskError
from fedsec.secagg.prg import word_dtype

MAX_MODULUS_BITS = 64


def _integer_in(value: numbers.Real, low: int, high: int) -> bool:
    """Whether a real number is an integer in [low, high] (no float overflow for huge values)."""
    if isinstance(value, numbers.Integral):
        return low <= int(value) <= high
    try:
        as_float = float(value)
    except (OverflowError, ValueError):
        return False
    return math.isfinite(as_float) and as_float.is_integer() and low <= as_float <= high


def clip_range(bits: int, modulus_bits: int = MAX_MODULUS_BITS) -> tuple[float, float]:
    """The clip values c that encode and decode without overflow or lost precision, as [lo, hi].

    lo = 2^bits x the smallest normal float: the quantisation step 2c / L (L = 2^bits - 1) is
    then a normal number (full 53-bit precision) and L / (2c) is finite; below it a step is
    subnormal or L / (2c) overflows, and every value encodes as +-c (c = 1e-310 at 16 bits).
    hi = the largest float / 2^(modulus_bits + 2): then 2c is finite and every decoded sum (a
    word below 2^modulus_bits times 2c / L, minus c times the total weight) stays below half the
    largest float; above it 2c or a decoded sum overflows to inf or NaN (c = 1e308).

    Args:
        bits: quantisation bits, >= 1.
        modulus_bits: bits of the summing modulus, 1..64 (64 covers every configuration).
    """
    lo = math.ldexp(sys.float_info.min, bits)
    hi = math.ldexp(sys.float_info.max, -(modulus_bits + 2))
    return lo, hi


@dataclass(frozen=True)
class Encoded:
    """An encoded client vector: ``words`` (m + 1 words, mod 2^b) and how many values were clipped."""

    words: np.ndarray
    clipped: int


class FixedPointEncoder:
    """Clip, quantise and weight float vectors into integers mod 2^b (see the module docstring).

    Args:
        clip: c > 0; each coordinate is clipped to [-c, c] (clipping is counted, never silent);
            c must lie in :func:`clip_range` (bits, modulus bits) so that it can be encoded.
        bits: quantisation bits per coordinate, 1 <= bits <= 48.
        max_clients: most vectors that will ever be summed, >= 1.
        max_weight: largest integer weight a client may use, >= 1.
        max_length: longest vector that will be encoded, >= 1 (bounds the clipped-count word).
        word_slack: room, >= 0, for a non-negative integer the caller adds to each value word
            after encoding (e.g. shifted integer noise); it widens the bound by max_clients x
            word_slack.

    Raises:
        WrapRiskError: the sum bound needs more than 64 bits.
        InvalidArgumentError: an argument out of range, e.g. a clip outside :func:`clip_range`.
    """

    def __init__(self, *, clip: float, bits: int, max_clients: int, max_weight: int,
                 max_length: int = 1, word_slack: int = 0) -> None:
        if not (math.isfinite(clip) and clip > 0):
            raise InvalidArgumentError(f"clip must be a finite number > 0, got {clip}")
        if not 1 <= bits <= 48:
            raise InvalidArgumentError(f"bits must be in [1, 48], got {bits}")
        if word_slack < 0:
            raise InvalidArgumentError(f"word_slack must be >= 0, got {word_slack}")
        if max_clients < 1 or max_weight < 1 or max_length < 1:
            raise InvalidArgumentError(
                f"max_clients, max_weight and max_length must be >= 1, got {max_clients}, "
                f"{max_weight}, {max_length}")
        self.clip = float(clip)
        self.bits = bits
        self.max_clients = max_clients
        self.max_weight = max_weight
        self.max_length = max_length
        self.word_slack = word_slack
        self.levels = (1 << bits) - 1
        self.word_bound = max(max_weight * self.levels + word_slack, max_length)
        bound = max_clients * self.word_bound
        self.modulus_bits = max(bound.bit_length(), 1)
        if self.modulus_bits > MAX_MODULUS_BITS:
            raise WrapRiskError(
                f"{max_clients} clients x weight {max_weight} x {bits}-bit values need a "
                f"{self.modulus_bits}-bit modulus; at most {MAX_MODULUS_BITS} bits are supported")
        lo, hi = clip_range(bits, self.modulus_bits)
        if not lo <= self.clip <= hi:
            raise InvalidArgumentError(
                f"clip must be in [{lo:.6g}, {hi:.6g}] for {bits}-bit values summed modulo "
                f"2^{self.modulus_bits}, got {clip}")
        self.dtype = word_dtype(self.modulus_bits)
        self.word_bytes = (self.modulus_bits + 7) // 8

    def encode(self, vector: np.ndarray, weight: int, *, rng: np.random.Generator) -> Encoded:
        """Encode one client's vector with its weight; randomised rounding draws from ``rng``."""
        if not isinstance(vector, np.ndarray) or vector.ndim != 1 or vector.dtype.kind not in "fiu":
            raise EncodingError("the vector to encode must be a one-dimensional numpy array of reals")
        if vector.size > self.max_length:
            raise EncodingError(f"vector length {vector.size} exceeds max_length {self.max_length}")
        with np.errstate(over="ignore"):
            values = vector.astype(np.float64)
        if not np.isfinite(values).all():
            raise EncodingError("the vector holds NaN or infinite values")
        if (isinstance(weight, bool | np.bool_) or not isinstance(weight, numbers.Real)
                or not _integer_in(weight, 1, self.max_weight)):
            raise EncodingError(f"weight must be an integer in [1, {self.max_weight}], got {weight!r}")
        clipped = int(np.count_nonzero(np.abs(values) > self.clip))
        scaled = (np.clip(values, -self.clip, self.clip) + self.clip) * (self.levels / (2 * self.clip))
        floor = np.floor(scaled)
        q = floor + (rng.random(values.size) < (scaled - floor))
        q = np.minimum(q, self.levels).astype(np.uint64)
        words = np.empty(values.size + 2, dtype=self.dtype)
        words[:-2] = q * np.uint64(weight)
        words[-2] = weight
        words[-1] = clipped
        return Encoded(words, clipped)

    def decode(self, total: np.ndarray) -> tuple[np.ndarray, int, int]:
        """From the (unwrapped) sum of encoded vectors to
        (sum_k w_k clip(x_k) as float64, sum_k w_k, total clipped coordinates)."""
        if total.ndim != 1 or total.size < 3:
            raise EncodingError("an encoded sum needs a value, the weight word and the clip word")
        total_weight = int(total[-2])
        weighted = total[:-2].astype(np.float64) * (2 * self.clip / self.levels)
        return weighted - self.clip * total_weight, total_weight, int(total[-1])

    def to_bytes(self, words: np.ndarray) -> bytes:
        """Little-endian words cut to ``word_bytes`` bytes each (ceil(b / 8))."""
        raw = np.ascontiguousarray(words, dtype=self.dtype.newbyteorder("<"))
        if self.word_bytes == self.dtype.itemsize:
            return raw.tobytes()
        return raw.view(np.uint8).reshape(-1, self.dtype.itemsize)[:, : self.word_bytes].tobytes()

    def from_bytes(self, data: bytes, length: int) -> np.ndarray:
        """Inverse of :meth:`to_bytes` for ``length`` words; raises EncodingError on a size mismatch."""
        if len(data) != length * self.word_bytes:
            raise EncodingError(f"expected {length * self.word_bytes} bytes, got {len(data)}")
        raw = np.frombuffer(data, dtype=np.uint8)
        if self.word_bytes == self.dtype.itemsize:
            return raw.view(self.dtype.newbyteorder("<")).astype(self.dtype, copy=False)
        wide = np.zeros((length, self.dtype.itemsize), dtype=np.uint8)
        wide[:, : self.word_bytes] = raw.reshape(length, self.word_bytes)
        words = wide.view(self.dtype.newbyteorder("<")).reshape(length).astype(self.dtype)
        if words.size and int(words.max()) >> self.modulus_bits:
            raise EncodingError("a word exceeds the modulus")
        return words

    def reduce(self, words: np.ndarray) -> np.ndarray:
        """Words mod 2^b, in place."""
        if self.modulus_bits < 8 * self.dtype.itemsize:
            np.bitwise_and(words, self.dtype.type((1 << self.modulus_bits) - 1), out=words)
        return words
