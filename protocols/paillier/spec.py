"""The public parameters of one Paillier aggregation, and the integrity tags bound to them.

A :class:`RoundSpec` fixes how clients pack (words per client, slot width, largest word, most
contributions); its SHA-256 digest enters every tag, so a server that tells clients one layout
and the key holder another fails the tag check.

Integrity tags. Client i and the key holder share a tag key (X25519 + HKDF). For a round, the
key derives one uniform 128-bit tag per ciphertext index k, and client i's plaintext k carries
t_{i,k} in its top field. The key holder, given the claimed contributors S, accepts a decrypted
aggregate only if every top field equals sum_{i in S} t_{i,k} exactly. The server, which never
learns a tag, cannot change which ciphertexts enter a sum, scale one, move one to another index
or reuse one from another round without changing some top field (see the README's trust model
for the argument and its limits).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from protocols.errors import MalformedMessage
from secagg.keys import context_bytes, derive_key
from secagg.paillier import PaillierPublicKey, SlotLayout, slot_bits_for
from secagg.prg import MaskExpander

TAG_BITS = 128
_SPEC = struct.Struct(">QIBQI?")


@dataclass(frozen=True)
class RoundSpec:
    """One aggregation's packing parameters.

    Args:
        sequence: strictly increasing aggregation number (the key holder decrypts each once).
        length: words per client, the trailing contribution-count word included, >= 1.
        slot_bits: bits per slot; must equal ``slot_bits_for(word_bound, max_contributions)``.
        word_bound: largest value of any one client's word, >= 1.
        max_contributions: most clients the sum may hold, >= 1.
        tagged: plaintexts carry integrity tags for a key holder (False under threshold custody,
            where the decrypting parties check signed submissions instead).
    """

    sequence: int
    length: int
    slot_bits: int
    word_bound: int
    max_contributions: int
    tagged: bool = True

    def __post_init__(self) -> None:
        if self.length < 1 or self.word_bound < 1 or self.max_contributions < 1:
            raise MalformedMessage("round spec: length, word bound and contributions must be >= 1")
        if self.slot_bits != slot_bits_for(self.word_bound, self.max_contributions):
            raise MalformedMessage("round spec: slot width does not match its word bound and "
                                   "number of contributions")

    @property
    def tag_bits(self) -> int:
        """Width of the top field: room for ``max_contributions`` 128-bit tags (0 if untagged)."""
        if not self.tagged:
            return 0
        return (self.max_contributions * ((1 << TAG_BITS) - 1)).bit_length()

    def layout(self, public_key: PaillierPublicKey) -> SlotLayout:
        return SlotLayout(slot_bits=self.slot_bits, plaintext_bits=public_key.plaintext_bits,
                          tag_bits=self.tag_bits)

    def ciphertexts(self, public_key: PaillierPublicKey) -> int:
        return self.layout(public_key).ciphertexts_for(self.length)

    def to_bytes(self) -> bytes:
        try:
            return _SPEC.pack(self.sequence, self.length, self.slot_bits, self.word_bound,
                              self.max_contributions, self.tagged)
        except struct.error:
            raise MalformedMessage("round spec field out of range") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> RoundSpec:
        if len(data) != _SPEC.size or data[-1] not in (0, 1):
            raise MalformedMessage("round spec has the wrong size or flag")
        return cls(*_SPEC.unpack(data))

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(b"fedsec/paillier/spec/v1" + self.to_bytes()).digest()


def tag_key(shared_secret: bytes, key_id: bytes, client_id: int) -> bytes:
    """The long-term tag key of one client with the key holder, bound to the Paillier key."""
    return derive_key(shared_secret, purpose=b"paillier-tag",
                      context=context_bytes(key_id, 0, client_id))


def round_tags(key: bytes, spec: RoundSpec, count: int) -> list[int]:
    """``count`` uniform 128-bit tags for the aggregation ``spec`` (AES-CTR under a derived key)."""
    round_key = derive_key(key, purpose=b"paillier-round-tag", context=spec.digest)
    words = MaskExpander(length=2 * count, modulus_bits=64).expand(round_key).reshape(count, 2)
    return [int(lo) | (int(hi) << 64) for lo, hi in words.astype(np.uint64).tolist()]
