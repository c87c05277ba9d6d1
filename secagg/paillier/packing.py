"""Packing many small non-negative integers into one Paillier plaintext, and back.

A plaintext holds ``slots`` data slots of ``slot_bits`` bits each (slot 0 in the lowest bits)
and, above them, an optional ``tag_bits``-wide field (the integrity tag of
:mod:`protocols.paillier`). Adding plaintexts adds slot by slot with no carry between slots as
long as every slot sum stays below 2^slot_bits: the caller sizes slot_bits from the largest word
and the most contributions (:func:`slot_bits_for`), and the layout is refused if the whole
plaintext cannot stay below 2^(key_bits - 1) < n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from secagg.errors import EncodingError, InvalidArgumentError, WrapRiskError

MAX_SLOT_BITS = 64


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
        count = self.ciphertexts_for(words.size)
        padded = np.zeros(count * self.slots, dtype=np.uint64)
        padded[: words.size] = words
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
