"""The key holder: the only party with the Paillier decryption key, and what it refuses.

It is a role apart from the server (an auditor, or one designated hospital). It decrypts one
aggregate per aggregation sequence number and releases the sum only if

- the sequence number is newer than every one it saw before (a request burns its number, so a
  server cannot ask twice with different contributor sets and subtract);
- the claimed contributors are distinct, enrolled, registered, at least ``threshold`` and at most
  the spec's ``max_contributions``;
- the batch is well formed, under its key, for that sequence, with the right count;
- every plaintext's top field equals the sum of the claimed contributors' tags for that index,
  the count word equals the number of contributors and no word exceeds what that many can sum to.

Anything else raises :class:`DecryptionRefused` and releases nothing.
"""

from __future__ import annotations

from protocols.errors import MalformedMessage, ProtocolAbort
from protocols.paillier.messages import (
    ANNOUNCE_DOMAIN,
    KEY_HOLDER,
    REGISTER_DOMAIN,
    Announcement,
    DecryptionRequest,
    DecryptionResult,
    Registration,
    decode,
    encode,
)
from protocols.paillier.spec import RoundSpec, round_tags, tag_key
from secagg.errors import CryptoError, EncodingError, InvalidArgumentError, InvalidCiphertextError
from secagg.keys import KeyPair, SigningKey, verify
from secagg.paillier import decode_batch, decrypt, generate_keypair


class DecryptionRefused(ProtocolAbort):
    """The key holder would not decrypt; ``reason`` says which rule fired. Nothing was released."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"key holder refused to decrypt: {reason}")
        self.reason = reason


class PaillierKeyHolder:
    """Generates the Paillier key, enrolls clients, and decrypts authenticated aggregates only.

    Args:
        threshold: fewest contributions it will decrypt a sum of, >= 2.
        key_bits: Paillier modulus size (2048 or 3072; 512/1024 only with ``allow_insecure``).
        identity: its Ed25519 identity key (clients know the public half beforehand).
    """

    def __init__(self, *, threshold: int, key_bits: int = 2048, identity: SigningKey | None = None,
                 allow_insecure: bool = False) -> None:
        if threshold < 2:
            raise InvalidArgumentError(f"threshold must be >= 2, got {threshold}")
        self.threshold = threshold
        self.identity = identity or SigningKey.generate()
        self.public_key, self._private_key = generate_keypair(key_bits, allow_insecure=allow_insecure)
        self._tag_pair = KeyPair.generate()
        self._roster: dict[int, bytes] = {}
        self._tag_keys: dict[int, bytes] = {}
        self.last_sequence = 0
        self.decryptions = 0

    def enroll(self, client_id: int, identity_public: bytes) -> None:
        """Admit a client's identity key (out of band: a certificate, an administrator)."""
        known = self._roster.setdefault(client_id, identity_public)
        if known != identity_public:
            raise InvalidArgumentError(f"client {client_id} is enrolled with another identity key")

    def announcement(self) -> bytes:
        """The signed key announcement every client checks before registering."""
        unsigned = Announcement(KEY_HOLDER, self.public_key.to_bytes(), self._tag_pair.public,
                                self.threshold)
        signature = self.identity.sign(ANNOUNCE_DOMAIN + unsigned.signed_part())
        return encode(Announcement(KEY_HOLDER, unsigned.public_key, unsigned.tag_public,
                                   self.threshold, signature))

    def register(self, data: bytes) -> None:
        """Accept an enrolled client's signed tag key; raises MalformedMessage otherwise."""
        message = decode(data, Registration)
        identity = self._roster.get(message.client_id)
        if identity is None:
            raise MalformedMessage(f"client {message.client_id} is not enrolled")
        if message.key_id != self.public_key.key_id:
            raise MalformedMessage("registration is for another Paillier key")
        try:
            verify(identity, message.signature, REGISTER_DOMAIN + message.signed_part())
            shared = self._tag_pair.agree(message.tag_public)
        except CryptoError:
            raise MalformedMessage("registration does not verify") from None
        self._tag_keys[message.client_id] = tag_key(shared, self.public_key.key_id,
                                                    message.client_id)

    def decrypt(self, data: bytes) -> bytes:
        """Check and decrypt one aggregate; returns the DecryptionResult message."""
        try:
            request = decode(data, DecryptionRequest)
            spec = RoundSpec.from_bytes(request.spec)
        except MalformedMessage as error:
            raise DecryptionRefused(f"malformed request ({error})") from None
        if spec.sequence <= self.last_sequence:
            raise DecryptionRefused(f"aggregation {spec.sequence} is not newer than "
                                    f"{self.last_sequence}")
        self.last_sequence = spec.sequence
        contributors = request.participants
        if len(set(contributors)) != len(contributors):
            raise DecryptionRefused("a contributor is listed twice")
        if any(c not in self._tag_keys for c in contributors):
            raise DecryptionRefused("a contributor is not registered")
        if not spec.tagged:
            raise DecryptionRefused("the aggregate carries no integrity tags")
        if not self.threshold <= len(contributors) <= spec.max_contributions:
            raise DecryptionRefused(f"{len(contributors)} contributors, need between "
                                    f"{self.threshold} and {spec.max_contributions}")
        try:
            layout = spec.layout(self.public_key)
            count = layout.ciphertexts_for(spec.length)
            values = decode_batch(request.batch, self.public_key, round_index=spec.sequence,
                                  count=count)
            words, tops = layout.unpack(decrypt(self._private_key, values), spec.length)
        except (InvalidArgumentError, InvalidCiphertextError, EncodingError) as error:
            raise DecryptionRefused(f"invalid aggregate ({error})") from None
        expected = [0] * count
        for c in contributors:
            for k, t in enumerate(round_tags(self._tag_keys[c], spec, count)):
                expected[k] += t
        if tops != expected:
            raise DecryptionRefused("integrity tags do not match the claimed contributors")
        if int(words[-1]) != len(contributors):
            raise DecryptionRefused("the count word does not match the claimed contributors")
        if int(words.max()) > len(contributors) * spec.word_bound:
            raise DecryptionRefused("a word exceeds what the contributors can sum to")
        self.decryptions += 1
        return encode(DecryptionResult(spec.sequence, contributors, words))
