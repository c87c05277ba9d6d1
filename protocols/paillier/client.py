"""The client of the Paillier protocol: check the key holder's key, register a tag key, encrypt.

A client encrypts each aggregation's words at most once (a server asking again for an old or
the same sequence number is refused), so no two of its ciphertexts under one set of tags hold
different updates.
"""

from __future__ import annotations

import numpy as np

from protocols.errors import ClientAbort, MalformedMessage
from protocols.paillier.messages import (
    ANNOUNCE_DOMAIN,
    REGISTER_DOMAIN,
    Announcement,
    Registration,
    Submission,
    decode,
    encode,
)
from protocols.paillier.spec import RoundSpec, round_tags, tag_key
from secagg.errors import CryptoError, InvalidArgumentError
from secagg.keys import KeyPair, SigningKey, verify
from secagg.paillier import DJNRandomness, PaillierPublicKey, encode_batch, encrypt
from secagg.paillier.keys import SECURE_KEY_BITS

BAD_ANNOUNCEMENT = "announcement does not verify"
WEAK_KEY = "Paillier key is too small or malformed"
LOW_THRESHOLD = "key holder threshold below 2"
NOT_READY = "no verified key yet"
BAD_SPEC = "round spec malformed or inconsistent"
REPLAY = "aggregation already contributed to"
BAD_WORDS = "words do not fit the round spec"


class PaillierClient:
    """One client's side of the Paillier protocol.

    Args:
        client_id: this client's id (u64, below 2^64 - 1).
        identity: this client's Ed25519 identity key (the key holder knows its public half).
        key_holder_identity: the key holder's Ed25519 public key, known out of band.
        min_key_bits: smallest Paillier modulus accepted (2048; smaller only for tests).
    """

    def __init__(self, client_id: int, *, identity: SigningKey, key_holder_identity: bytes,
                 min_key_bits: int = min(SECURE_KEY_BITS)) -> None:
        self.client_id = client_id
        self._identity = identity
        self._key_holder_identity = key_holder_identity
        self.min_key_bits = min_key_bits
        self.public_key: PaillierPublicKey | None = None
        self.threshold = 0
        self._randomness: DJNRandomness | None = None
        self._tag_key = b""
        self._last_sequence = 0

    def receive_announcement(self, data: bytes) -> bytes:
        """Verify the key holder's signed key; returns this client's signed registration."""
        try:
            message = decode(data, Announcement)
            verify(self._key_holder_identity, message.signature,
                   ANNOUNCE_DOMAIN + message.signed_part())
        except (MalformedMessage, CryptoError):
            raise ClientAbort(BAD_ANNOUNCEMENT) from None
        try:
            public_key = PaillierPublicKey.from_bytes(message.public_key)
        except InvalidArgumentError:
            raise ClientAbort(WEAK_KEY) from None
        if public_key.key_bits < self.min_key_bits:
            raise ClientAbort(WEAK_KEY)
        if message.threshold < 2:
            raise ClientAbort(LOW_THRESHOLD)
        pair = KeyPair.generate()
        try:
            shared = pair.agree(message.tag_public)
        except CryptoError:
            raise ClientAbort(BAD_ANNOUNCEMENT) from None
        if public_key != self.public_key:
            self._randomness = DJNRandomness(public_key)
        self.public_key, self.threshold = public_key, message.threshold
        self._tag_key = tag_key(shared, public_key.key_id, self.client_id)
        registration = Registration(self.client_id, public_key.key_id, pair.public)
        signature = self._identity.sign(REGISTER_DOMAIN + registration.signed_part())
        return encode(Registration(self.client_id, public_key.key_id, pair.public, signature))

    def submit(self, spec_bytes: bytes, words: np.ndarray) -> bytes:
        """Encrypt ``words`` (the encoder's words, without the count word) for the round ``spec``.

        Returns the Submission message; raises ClientAbort if the spec is malformed, asks for an
        aggregation this client already contributed to, or does not fit the words.
        """
        if self.public_key is None or self._randomness is None:
            raise ClientAbort(NOT_READY)
        try:
            spec = RoundSpec.from_bytes(spec_bytes)
            layout = spec.layout(self.public_key)
        except (MalformedMessage, InvalidArgumentError):
            raise ClientAbort(BAD_SPEC) from None
        if spec.sequence <= self._last_sequence:
            raise ClientAbort(REPLAY)
        if spec.max_contributions < self.threshold:
            raise ClientAbort(BAD_SPEC)
        words = np.asarray(words)
        if (words.ndim != 1 or words.dtype.kind not in "ui" or words.size != spec.length - 1
                or (words.size and (int(words.min()) < 0 or int(words.max()) > spec.word_bound))):
            raise ClientAbort(BAD_WORDS)
        full = np.empty(spec.length, dtype=np.uint64)
        full[:-1] = words
        full[-1] = 1
        count = layout.ciphertexts_for(spec.length)
        plaintexts = layout.pack(full, round_tags(self._tag_key, spec, count))
        ciphertexts = encrypt(self.public_key, plaintexts, self._randomness)
        self._last_sequence = spec.sequence
        batch = encode_batch(self.public_key, spec.sequence, ciphertexts)
        return encode(Submission(self.client_id, spec.digest, batch))
