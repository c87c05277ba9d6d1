"""Packing many small non-negative integers into one Paillier plaintext, and back.

A plaintext holds ``slots`` data slots of ``slot_bits`` bits each (slot 0 in the lowest bits)
and, above them, an optional ``tag_bits``-wide field (the integrity tag of
:mod:`protocols.paillier`). Adding plaintexts adds slot by slot with no carry between slots as
long as every slot sum stays below 2^slot_bits: the caller sizes slot_bits from the largest word
and the most contributions (:func:`slot_bits_for`), and the layout is refused if the whole
plaintext cannot stay below 2^(key_bits - 1) < n.

Carries. A sum whose slot j reaches 2^slot_bits carries into slot j + 1: every unpacked word can
still look in range, so a range check cannot see it. :func:`slot_forms` is what makes a carry
visible: a linear form sum_j a_j s_j mod p (p = 2^127 - 1) over the slot values s_j with
secret coefficients a_j. It adds up slot by slot, so the form of a sum of plaintexts is the sum of
their forms exactly when no slot carried; a carry changes the slot vector by
(-2^slot_bits at j, +1 at j + 1), which moves the form by a_{j+1} - 2^slot_bits a_j, zero only with
probability 1/p over the coefficients. :meth:`SlotLayout.unpack_rows` returns the slot vector of
every plaintext (padding slots included) for that check, and never raises on a value it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from fedsec.secagg.errors import EncodingError, InvalidArgumentError, WrapRiskError

MAX_SLOT_BITS = 64
MAC_PRIME = (1 << 127) - 1
"""The prime modulus of :func:`slot_forms` (a Mersenne prime)."""
COEFFICIENT_BYTES = 16
"""Bytes of keystream per coefficient of :func:`slot_forms` (the top bit is cleared)."""
_LIMB = 16


def slot_bits_for(word_bound: int, max_contributions: int) -> int:
    """Slot width whose capacity holds ``max_contributions`` words of at most ``word_bound``."""
    if word_bound < 1 or max_contributions < 1:
        raise InvalidArgumentError("word_bound and max_contributions must be >= 1")
    return (word_bound * max_contributions).bit_length()


@dataclass(frozen=True)
class SlotLayout:
    """How words map to plaintexts.

    Args:
        slot_bits: bits per slot, in [1, 64].
        plaintext_bits: usable bits of a plaintext (key_bits - 1).
        tag_bits: width of the top field, >= 0 (0: no tag field).
    """

    slot_bits: int
    plaintext_bits: int
    tag_bits: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.slot_bits <= MAX_SLOT_BITS:
            raise WrapRiskError(f"slots of {self.slot_bits} bits are not supported (1 to "
                                f"{MAX_SLOT_BITS}); use fewer quantisation bits or fewer clients")
        if self.tag_bits < 0:
            raise InvalidArgumentError(f"tag_bits must be >= 0, got {self.tag_bits}")
        if self.slots < 1:
            raise WrapRiskError(f"a {self.plaintext_bits}-bit plaintext has no room for a "
                                f"{self.slot_bits}-bit slot beside a {self.tag_bits}-bit tag")

    @property
    def slots(self) -> int:
        """Data slots per plaintext."""
        return (self.plaintext_bits - self.tag_bits) // self.slot_bits

    @property
    def data_bits(self) -> int:
        """Bits below the tag field."""
        return self.slots * self.slot_bits

    def ciphertexts_for(self, length: int) -> int:
        """Plaintexts needed for ``length`` words."""
        return max(1, math.ceil(length / self.slots))

    def pack(self, words: np.ndarray, tags: list[int] | None = None) -> list[int]:
        """Words (non-negative, each < 2^slot_bits) into plaintexts, with ``tags`` on top if given."""
        words = np.asarray(words)
        if words.ndim != 1 or words.dtype.kind not in "ui":
            raise EncodingError("words must be a one-dimensional integer array")
        if words.size and (int(words.min()) < 0 or int(words.max()) >> self.slot_bits):
            raise EncodingError(f"a word does not fit a {self.slot_bits}-bit slot")
        padded = self.rows(words).reshape(-1)
        count = padded.size // self.slots
        shifts = np.arange(self.slot_bits, dtype=np.uint64)
        bits = ((padded[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
        row_bits = self.slots * self.slot_bits
        row_bytes = (row_bits + 7) // 8
        rows = np.zeros((count, row_bytes * 8), dtype=np.uint8)
        rows[:, :row_bits] = bits.reshape(count, row_bits)
        packed = np.packbits(rows, axis=1, bitorder="little")
        values = [int.from_bytes(row.tobytes(), "little") for row in packed]
        if tags is not None:
            if len(tags) != count:
                raise EncodingError(f"expected {count} tags, got {len(tags)}")
            if any(not 0 <= t < 1 << self.tag_bits for t in tags):
                raise EncodingError(f"a tag does not fit {self.tag_bits} bits")
            shift = self.data_bits
            values = [v | (t << shift) for v, t in zip(values, tags, strict=True)]
        return values

    def rows(self, words: np.ndarray) -> np.ndarray:
        """The words as a (plaintexts, slots) uint64 matrix, zero-padded (what :meth:`pack` packs)."""
        words = np.asarray(words)
        count = self.ciphertexts_for(words.size)
        padded = np.zeros(count * self.slots, dtype=np.uint64)
        padded[: words.size] = words
        return padded.reshape(count, self.slots)

    def unpack_rows(self, values: list[int]) -> tuple[np.ndarray, list[int], bool]:
        """Plaintexts (or their sums) to (slot matrix (len(values), slots) uint64, top fields,
        whether every value lay in [0, 2^plaintext_bits)). Never raises on a value: one out of
        range contributes its low bits and its whole high part, and the flag is False."""
        row_bits = self.slots * self.slot_bits
        row_bytes = (row_bits + 7) // 8
        mask = (1 << self.data_bits) - 1
        raw, tops, in_range = bytearray(), [], True
        for v in values:
            v = int(v)
            in_range &= 0 <= v < 1 << self.plaintext_bits
            raw += (v & mask).to_bytes(row_bytes, "little")
            tops.append(v >> self.data_bits)
        count = len(values)
        bits = np.unpackbits(np.frombuffer(bytes(raw), dtype=np.uint8).reshape(count, row_bytes),
                             axis=1, bitorder="little")[:, :row_bits]
        slots = bits.reshape(count, self.slots, self.slot_bits).astype(np.uint64)
        weights = np.uint64(1) << np.arange(self.slot_bits, dtype=np.uint64)
        return (slots * weights).sum(axis=2, dtype=np.uint64), tops, bool(in_range)

    def unpack(self, values: list[int], length: int) -> tuple[np.ndarray, list[int]]:
        """Plaintexts (or their sums) back to (``length`` words as uint64, the tag field of each).

        Raises EncodingError if a plaintext is negative or exceeds ``plaintext_bits``.
        """
        count = self.ciphertexts_for(length)
        if len(values) != count:
            raise EncodingError(f"{length} words need {count} plaintexts, got {len(values)}")
        row_bits = self.slots * self.slot_bits
        row_bytes = (row_bits + 7) // 8
        mask = (1 << self.data_bits) - 1
        raw, tags = bytearray(), []
        for v in values:
            v = int(v)
            if v < 0 or v >> self.plaintext_bits:
                raise EncodingError("a plaintext lies outside the packed range")
            raw += (v & mask).to_bytes(row_bytes, "little")
            tags.append(v >> self.data_bits)
        bits = np.unpackbits(np.frombuffer(bytes(raw), dtype=np.uint8).reshape(count, row_bytes),
                             axis=1, bitorder="little")[:, :row_bits]
        slots = bits.reshape(count * self.slots, self.slot_bits).astype(np.uint64)
        weights = np.uint64(1) << np.arange(self.slot_bits, dtype=np.uint64)
        words = (slots * weights).sum(axis=1, dtype=np.uint64)
        return words[:length], tags


def coefficients_from(keystream: np.ndarray, count: int, slots: int) -> np.ndarray:
    """Coefficients for :func:`slot_forms` from ``count x slots x 16`` uniform bytes (uint8), as a
    (count, slots, 8) array of 16-bit limbs, least significant first, each below 2^127."""
    keystream = np.ascontiguousarray(keystream, dtype=np.uint8)
    if keystream.size != count * slots * COEFFICIENT_BYTES:
        raise InvalidArgumentError(f"need {count * slots * COEFFICIENT_BYTES} keystream bytes, "
                                   f"got {keystream.size}")
    limbs = keystream.view("<u2").reshape(count, slots, COEFFICIENT_BYTES // 2).copy()
    limbs[:, :, -1] &= np.uint16(0x7FFF)
    return limbs


def slot_forms(rows: np.ndarray, coefficients: np.ndarray) -> list[int]:
    """For each plaintext k: sum_j a_{k,j} s_{k,j} mod MAC_PRIME, exactly, in numpy.

    Args:
        rows: (count, slots) slot values, uint64.
        coefficients: (count, slots, 8) 16-bit limbs of a_{k,j} (:func:`coefficients_from`).

    Each coefficient and value is split into 16-bit limbs, the limb products (< 2^32) are summed
    over the slots in uint64 (exact for up to 2^31 slots), and only the 11 diagonal sums per
    plaintext are recombined as Python integers.
    """
    rows = np.asarray(rows, dtype=np.uint64)
    count, slots = rows.shape
    if coefficients.shape != (count, slots, COEFFICIENT_BYTES // 2):
        raise InvalidArgumentError(f"coefficients of shape {coefficients.shape} do not match "
                                   f"{rows.shape} slots")
    value_limbs = np.ascontiguousarray(rows).view("<u2").reshape(count, slots, 4).astype(np.uint64)
    products = np.matmul(coefficients.astype(np.uint64).transpose(0, 2, 1), value_limbs)
    diagonals = np.zeros((count, COEFFICIENT_BYTES // 2 + 3), dtype=np.uint64)
    for a in range(COEFFICIENT_BYTES // 2):
        diagonals[:, a : a + 4] += products[:, a, :]
    powers = np.array([1 << (_LIMB * d) for d in range(diagonals.shape[1])], dtype=object)
    forms = diagonals.astype(object) @ powers
    return [int(f) % MAC_PRIME for f in forms]
