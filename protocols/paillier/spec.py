"""The public parameters of one Paillier aggregation, and the integrity tags bound to them.

A :class:`RoundSpec` fixes how clients pack (words per client, slot width, largest word, most
contributions) and, under key-holder custody, which roster the sum may draw on (the digest of the
plan's site names, :func:`roster_digest`) and the digest of the noise context its clients'
client-level shares are drawn for (review S6-1); its SHA-256 digest enters every tag, so a server that
tells clients one layout or roster and the key holder another fails the tag check. A client
submits only to a spec whose roster digest is its own plan's, and the key holder decrypts only a
sum whose every contributor's enrolled name is in the roster named by the spec (review S5-1).

Integrity tags: a linear MAC over every slot. The key holder hands every registered client the
same group MAC key K (sealed under their pairwise X25519 key), and client i shares a pad key with
the key holder. For aggregation ``spec`` and plaintext index k, K derives secret coefficients
a_{k,j} (one per slot j, below 2^127) and client i's pad key derives a pad b_{i,k}; both are
bound to the spec digest. Client i's plaintext k, with slot values s_{i,k,j}, carries in its top
field

    T_{i,k} = (sum_j a_{k,j} s_{i,k,j} + b_{i,k}) mod p,   p = 2^127 - 1.

The key holder, given the claimed contributors S and the decrypted sum with slots w_{k,j} and top
field T_k, accepts only if for every k: T_k < |S| p and
T_k = sum_j a_{k,j} w_{k,j} + sum_{i in S} b_{i,k} (mod p). Both sides add up over clients as
long as no slot carries (:func:`secagg.paillier.packing.slot_forms`), so honest sums pass; the
argument for why nothing else does (with its adversaries) is in docs/paillier-keyholder.md.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.wire import Writer
from fedsec.secagg.keys import context_bytes, derive_key
from fedsec.secagg.paillier import PaillierPublicKey, SlotLayout, slot_bits_for
from fedsec.secagg.paillier.packing import MAC_PRIME, coefficients_from, slot_forms
from fedsec.secagg.prg import MaskExpander

TAG_BITS = 128
ROSTER_BYTES = 32
NO_ROSTER = bytes(ROSTER_BYTES)
"""The roster digest of a spec bound to no roster (threshold custody, whose parties check every
contributor against their own roster instead); a key holder refuses to decrypt under it."""
MAX_NAME_BYTES = 255
NO_CONTEXT = bytes(ROSTER_BYTES)
"""The noise context of a spec whose sum carries no client-level noise the clients check."""
_SPEC = struct.Struct(">QIBQI?32s32s")
_ROSTER_DOMAIN = b"fedsec/paillier/roster/v1"


def canonical_roster(names: Sequence[str]) -> tuple[str, ...]:
    """The canonical form of a roster: its names sorted (so the plan's order does not matter).

    Raises MalformedMessage if a name is not a non-empty string of at most
    :data:`MAX_NAME_BYTES` UTF-8 bytes, a name repeats, or the roster is empty."""
    if isinstance(names, str | bytes) or not names:
        raise MalformedMessage("roster: must be a non-empty list of names")
    for name in names:
        try:
            size = len(name.encode("utf-8")) if isinstance(name, str) else 0
        except UnicodeEncodeError:
            size = 0
        if not 1 <= size <= MAX_NAME_BYTES:
            raise MalformedMessage(f"roster: names must be 1 to {MAX_NAME_BYTES} bytes of UTF-8 text")
    ordered = tuple(sorted(names))
    if len(set(ordered)) != len(ordered):
        raise MalformedMessage("roster: a name is listed twice")
    return ordered


def roster_digest(names: Sequence[str]) -> bytes:
    """SHA-256 of the canonical roster (sorted names, length-prefixed UTF-8): what a spec binds.

    Raises MalformedMessage on a roster :func:`canonical_roster` refuses. The last few rosters'
    digests are cached (a simulated client checks its population's roster every round)."""
    if isinstance(names, str | bytes):
        raise MalformedMessage("roster: must be a non-empty list of names")
    try:
        return _roster_digest(tuple(names))
    except TypeError:
        raise MalformedMessage("roster: names must be text") from None


@functools.lru_cache(maxsize=16)
def _roster_digest(names: tuple[str, ...]) -> bytes:
    ordered = canonical_roster(names)
    w = Writer().fixed(_ROSTER_DOMAIN, len(_ROSTER_DOMAIN)).u32(len(ordered))
    for name in ordered:
        w.blob(name.encode("utf-8"))
    return hashlib.sha256(w.getvalue()).digest()


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
        roster: 32-byte :func:`roster_digest` of the site names the sum may draw on (key-holder
            custody: a client submits only under its own plan's, the key holder decrypts only
            contributors enrolled under a name of it); :data:`NO_ROSTER` for none.
        context: 32-byte digest of the sum's noise context (client-level DP in a deployment:
            the plan, noise multiplier, threshold and colluders every client's share is drawn
            for; a client submits only under its own, review S6-1); :data:`NO_CONTEXT` for none.

    Untagged (threshold custody) layouts give every slot one **guard bit** above its
    ``slot_bits``: slots are ``slot_bits + 1`` wide, an honest sum never sets the guard bit, and
    the coordinator refuses a combined sum in which any guard bit is set (a slot carried, or a
    client put a value of ``slot_bits`` bits where the sum overflows). Tagged layouts need no
    guard: the MAC refuses carries.
    """

    sequence: int
    length: int
    slot_bits: int
    word_bound: int
    max_contributions: int
    tagged: bool = True
    roster: bytes = NO_ROSTER
    context: bytes = NO_CONTEXT

    def __post_init__(self) -> None:
        if not isinstance(self.roster, bytes) or len(self.roster) != ROSTER_BYTES:
            raise MalformedMessage(f"round spec: the roster digest must be {ROSTER_BYTES} bytes")
        if not isinstance(self.context, bytes) or len(self.context) != ROSTER_BYTES:
            raise MalformedMessage(f"round spec: the noise context must be {ROSTER_BYTES} bytes")
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

    @property
    def guard_bits(self) -> int:
        """Guard bits above each slot: 1 untagged (threshold custody), 0 tagged."""
        return 0 if self.tagged else 1

    def layout(self, public_key: PaillierPublicKey) -> SlotLayout:
        """The packing: slots of ``slot_bits + guard_bits`` bits, the tag field on top if tagged."""
        return SlotLayout(slot_bits=self.slot_bits + self.guard_bits,
                          plaintext_bits=public_key.plaintext_bits, tag_bits=self.tag_bits)

    def ciphertexts(self, public_key: PaillierPublicKey) -> int:
        return self.layout(public_key).ciphertexts_for(self.length)

    def to_bytes(self) -> bytes:
        try:
            return _SPEC.pack(self.sequence, self.length, self.slot_bits, self.word_bound,
                              self.max_contributions, self.tagged, self.roster, self.context)
        except struct.error:
            raise MalformedMessage("round spec field out of range") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> RoundSpec:
        if len(data) != _SPEC.size or data[_SPEC.size - 2 * ROSTER_BYTES - 1] not in (0, 1):
            raise MalformedMessage("round spec has the wrong size or flag")
        return cls(*_SPEC.unpack(data))

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(b"fedsec/paillier/spec/v3" + self.to_bytes()).digest()


def tag_key(shared_secret: bytes, key_id: bytes, client_id: int) -> bytes:
    """The long-term tag key of one client with the key holder, bound to the Paillier key."""
    return derive_key(shared_secret, purpose=b"paillier-tag",
                      context=context_bytes(key_id, 0, client_id))


def round_tags(key: bytes, spec: RoundSpec, count: int) -> list[int]:
    """``count`` uniform 128-bit pads b_{i,k} for the aggregation ``spec`` (AES-CTR under a
    derived key; used mod p, within statistical distance 2^-126 of uniform)."""
    round_key = derive_key(key, purpose=b"paillier-round-tag", context=spec.digest)
    words = MaskExpander(length=2 * count, modulus_bits=64).expand(round_key).reshape(count, 2)
    return [int(lo) | (int(hi) << 64) for lo, hi in words.astype(np.uint64).tolist()]


def round_coefficients(mac_key: bytes, spec: RoundSpec, layout: SlotLayout, count: int) -> np.ndarray:
    """The MAC coefficients a_{k,j} of aggregation ``spec``: (count, slots, 8) 16-bit limbs."""
    round_key = derive_key(mac_key, purpose=b"paillier-round-mac", context=spec.digest)
    stream = MaskExpander(length=2 * count * layout.slots, modulus_bits=64).expand(round_key)
    return coefficients_from(stream.astype("<u8").view(np.uint8), count, layout.slots)


def client_tags(mac_key: bytes, pad_key: bytes, spec: RoundSpec, layout: SlotLayout,
                rows: np.ndarray) -> list[int]:
    """T_{i,k} = (sum_j a_{k,j} s_{k,j} + b_{i,k}) mod p for a client's slot matrix ``rows``."""
    count = rows.shape[0]
    forms = slot_forms(rows, round_coefficients(mac_key, spec, layout, count))
    return [(f + b) % MAC_PRIME for f, b in zip(forms, round_tags(pad_key, spec, count), strict=True)]


def wrap_key(shared_secret: bytes, key_id: bytes, epoch: int, client_id: int) -> bytes:
    """The AES-GCM key that seals the group MAC key for one client (key holder and that client)."""
    return derive_key(shared_secret, purpose=b"paillier-mac-key-wrap",
                      context=context_bytes(key_id, epoch, client_id))


def welcome_associated(key_id: bytes, epoch: int, client_id: int) -> bytes:
    """Associated data of the sealed group MAC key."""
    return b"fedsec/paillier/welcome/v1" + context_bytes(key_id, epoch, client_id)
