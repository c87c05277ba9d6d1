"""The client of the Paillier protocol: check the announced key, encrypt, and (under threshold
custody) check what it is asked to decrypt before it helps.

A client encrypts each aggregation's words at most once per key (an old or repeated sequence
number is refused; it tracks the last one per Paillier key id, and accepts a new one only up to
:data:`MAX_SEQUENCE_GAP` ahead, so one forged spec cannot lock it out), so no two of its
ciphertexts for one aggregation hold different updates; under
threshold custody it proves knowledge of its plaintexts, and as a party it endorses one
contributor list per aggregation and decrypts only a list a quorum endorsed
(:mod:`protocols.paillier.party`), so no server can have two different sums of one aggregation
decrypted. The dealer's verification keys are taken once per (key id, key epoch): the party,
and its endorsement record, are never rebuilt by a replay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from fedsec.protocols.errors import ClientAbort, MalformedMessage
from fedsec.protocols.paillier import party as party_rules
from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.protocols.paillier.binding import submission_context
from fedsec.protocols.paillier.messages import (
    ANNOUNCE_DOMAIN,
    KEY_HOLDER,
    REGISTER_DOMAIN,
    SUBMIT_DOMAIN,
    THRESHOLD,
    Announcement,
    Registration,
    Submission,
    Welcome,
    decode,
    encode,
)
from fedsec.protocols.paillier.party import DecryptionParty
from fedsec.protocols.paillier.spec import (
    NO_CONTEXT,
    RoundSpec,
    client_tags,
    roster_digest,
    tag_key,
    welcome_associated,
    wrap_key,
)
from fedsec.protocols.paillier.state import MAX_SEQUENCE, EndorsementStore, MemoryEndorsementStore
from fedsec.protocols.paillier.trust import read_verification_keys
from fedsec.secagg.errors import CryptoError, InvalidArgumentError
from fedsec.secagg.keys import KeyPair, SigningKey, open_sealed, verify
from fedsec.secagg.paillier import (
    DJNRandomness,
    PaillierPublicKey,
    encode_batch,
    encrypt,
)
from fedsec.secagg.paillier.keys import SECURE_KEY_BITS
from fedsec.secagg.paillier.knowledge import encrypt_with_witness, prove_knowledge
from fedsec.secagg.paillier.threshold import KeyShare

BAD_ANNOUNCEMENT = "announcement does not verify"
WEAK_KEY = "Paillier key is too small or malformed"
LOW_THRESHOLD = "threshold below 2"
WRONG_SHARE = "key share does not match the announced key"
NOT_READY = "no verified key yet"
BAD_SPEC = "round spec malformed or inconsistent"
REPLAY = "aggregation already contributed to"
BAD_WORDS = "words do not fit the round spec"
BAD_REQUEST = "decryption request or contributor list malformed"
BAD_KEYS = "verification keys do not verify"
UNAUTHENTICATED, TOO_FEW = party_rules.UNAUTHENTICATED, party_rules.TOO_FEW
STALE_ANNOUNCEMENT = "announcement is for an older key epoch, or differs from this epoch's"
BAD_WELCOME = "welcome does not open or is for another key"
SEQUENCE_JUMP = "sequence number jumps too far ahead"
OTHER_KEYS = "different verification keys for this key and epoch"
OTHER_ROSTER = "the round spec binds another roster than this client's own"
OTHER_CONTEXT = "the round spec binds another noise context than this client's own"

MAX_SEQUENCE_GAP = 1 << 20
"""A client accepts aggregation sequence number s only in (last, last + MAX_SEQUENCE_GAP] (last:
the last one it submitted to under the same Paillier key, 0 at first). Specs are not signed, so a
lying server can still move a client ahead by at most this many numbers per spec; an honest
server then catches up by voiding the skipped numbers (cheap), instead of the client being
locked out for the key's lifetime."""


class PaillierClient:
    """One client's side of the Paillier protocol.

    Args:
        client_id: this client's id (u64, below 2^64 - 1).
        identity: this client's Ed25519 identity key (the key holder knows its public half).
        announcer_identity: Ed25519 public key of whoever announces the Paillier key (the key
            holder, or the threshold dealer), known out of band.
        share: this client's key share (threshold custody only).
        roster: client id -> Ed25519 identity public key of every client (threshold custody: to
            check the submissions in a decryption request).
        min_key_bits: smallest Paillier modulus accepted (2048; smaller only for tests).
        endorsements: threshold custody: where this client, as a party, records the one list it
            endorsed per (key, sequence) (default: in memory; a deployment passes a durable
            ``fedsec.state.SqliteEndorsementStore``).
    """

    def __init__(self, client_id: int, *, identity: SigningKey, announcer_identity: bytes,
                 share: KeyShare | None = None, roster: Mapping[int, bytes] | None = None,
                 min_key_bits: int = min(SECURE_KEY_BITS),
                 endorsements: EndorsementStore | None = None) -> None:
        self.client_id = client_id
        self._identity = identity
        self._announcer_identity = announcer_identity
        self._share = share
        self._roster = dict(roster or {})
        self.min_key_bits = min_key_bits
        self.public_key: PaillierPublicKey | None = None
        self.custody = 0
        self.threshold = 0
        self._randomness: DJNRandomness | None = None
        self._tag_key = b""
        self._last_submitted: dict[bytes, int] = {}
        self.epoch = 0
        self._announced = b""
        self._registration: bytes | None = None
        self._wrap_key = b""
        self._mac_key = b""
        self._party: DecryptionParty | None = None
        self._party_keys: tuple[bytes, int, bytes] | None = None
        self._endorsements: EndorsementStore = (endorsements if endorsements is not None
                                                else MemoryEndorsementStore())

    def receive_announcement(self, data: bytes) -> bytes | None:
        """Verify the signed key announcement. Under key-holder custody returns this client's
        signed registration (its tag key); under threshold custody returns None.

        The key epoch only moves forward: an announcement for an older epoch, or a different one
        for the current epoch (a replay of an old key), is refused; the current one again gets
        the same registration back."""
        try:
            message = decode(data, Announcement)
            verify(self._announcer_identity, message.signature,
                   ANNOUNCE_DOMAIN + message.signed_part())
        except (MalformedMessage, CryptoError):
            raise ClientAbort(BAD_ANNOUNCEMENT) from None
        if message.epoch < self.epoch or (message.epoch == self.epoch
                                          and message.signed_part() != self._announced):
            raise ClientAbort(STALE_ANNOUNCEMENT)
        if message.epoch == self.epoch:
            return self._registration
        try:
            public_key = PaillierPublicKey.from_bytes(message.public_key)
        except InvalidArgumentError:
            raise ClientAbort(WEAK_KEY) from None
        if public_key.key_bits < self.min_key_bits:
            raise ClientAbort(WEAK_KEY)
        if message.threshold < 2:
            raise ClientAbort(LOW_THRESHOLD)
        if message.custody == THRESHOLD and (
                self._share is None or self._share.public_key != public_key
                or self._share.threshold != message.threshold):
            raise ClientAbort(WRONG_SHARE)
        if message.custody == KEY_HOLDER:
            pair = KeyPair.generate()
            try:
                shared = pair.agree(message.tag_public)
            except CryptoError:
                raise ClientAbort(BAD_ANNOUNCEMENT) from None
        if public_key != self.public_key:
            self._randomness = DJNRandomness(public_key)
        self.public_key, self.threshold, self.custody = public_key, message.threshold, message.custody
        self.epoch, self._announced, self._registration = message.epoch, message.signed_part(), None
        self._mac_key = b""
        if message.custody != KEY_HOLDER:
            return None
        self._tag_key = tag_key(shared, public_key.key_id, self.client_id)
        self._wrap_key = wrap_key(shared, public_key.key_id, message.epoch, self.client_id)
        registration = Registration(self.client_id, public_key.key_id, pair.public,
                                    epoch=message.epoch)
        signature = self._identity.sign(REGISTER_DOMAIN + registration.signed_part())
        self._registration = encode(Registration(self.client_id, public_key.key_id, pair.public,
                                                 signature, message.epoch))
        return self._registration

    def receive_welcome(self, data: bytes) -> None:
        """Key-holder custody: open the group MAC key the key holder sealed for this client."""
        if self.public_key is None or self.custody != KEY_HOLDER:
            raise ClientAbort(NOT_READY)
        try:
            message = decode(data, Welcome)
            if (message.client_id, message.key_id, message.epoch) != (
                    self.client_id, self.public_key.key_id, self.epoch):
                raise ClientAbort(BAD_WELCOME)
            mac_key = open_sealed(self._wrap_key, message.sealed,
                                  welcome_associated(message.key_id, message.epoch, self.client_id))
        except (MalformedMessage, CryptoError):
            raise ClientAbort(BAD_WELCOME) from None
        self._mac_key = mac_key

    def _spec(self, spec_bytes: bytes) -> RoundSpec:
        if self.public_key is None or self._randomness is None or (
                self.custody == KEY_HOLDER and not self._mac_key):
            raise ClientAbort(NOT_READY)
        try:
            spec = RoundSpec.from_bytes(spec_bytes)
            spec.layout(self.public_key)
        except (MalformedMessage, InvalidArgumentError):
            raise ClientAbort(BAD_SPEC) from None
        if spec.tagged != (self.custody == KEY_HOLDER) or spec.max_contributions < self.threshold:
            raise ClientAbort(BAD_SPEC)
        return spec

    def submit(self, spec_bytes: bytes, words: np.ndarray, *, roster: Sequence[str] | None = None,
               context: bytes = NO_CONTEXT) -> bytes:
        """Encrypt ``words`` (the encoder's words, without the count word) for ``spec``.

        ``roster``: the names of this client's own roster (its plan's sites), required under
        key-holder custody: the spec must bind exactly that roster (:func:`roster_digest`, in
        any order), or the client refuses (OTHER_ROSTER). Its tags bind the spec, roster digest
        included, so the key holder can decrypt this submission only in a sum whose every
        contributor is enrolled under a name of this roster. ``context``: the digest of this
        client's own noise context (:func:`fedsec.network.client_noise.noise_context`, or
        :data:`NO_CONTEXT`); the spec must carry exactly it (OTHER_CONTEXT), so every client of one
        sum drew its noise share for the same rule (review S6-1).

        Returns the signed Submission; raises ClientAbort if the spec is malformed, binds another
        roster (OTHER_ROSTER), names an aggregation this client already contributed to under this
        key (REPLAY), jumps more than :data:`MAX_SEQUENCE_GAP` ahead of the last one
        (SEQUENCE_JUMP), or does not fit the words.
        """
        spec = self._spec(spec_bytes)
        if spec.tagged:
            try:
                own = roster_digest(roster) if roster is not None else None
            except MalformedMessage:
                raise ClientAbort(OTHER_ROSTER) from None
            if own is None or spec.roster != own:
                raise ClientAbort(OTHER_ROSTER)
        if spec.context != context:
            raise ClientAbort(OTHER_CONTEXT)
        last = self._last_submitted.get(self.public_key.key_id, 0)
        if spec.sequence <= last:
            raise ClientAbort(REPLAY)
        if spec.sequence > min(last + MAX_SEQUENCE_GAP, MAX_SEQUENCE):
            raise ClientAbort(SEQUENCE_JUMP)
        words = np.asarray(words)
        if (words.ndim != 1 or words.dtype.kind not in "ui" or words.size != spec.length - 1
                or (words.size and (int(words.min()) < 0 or int(words.max()) > spec.word_bound))):
            raise ClientAbort(BAD_WORDS)
        full = np.empty(spec.length, dtype=np.uint64)
        full[:-1] = words
        full[-1] = 1
        layout = spec.layout(self.public_key)
        tags = (client_tags(self._mac_key, self._tag_key, spec, layout, layout.rows(full))
                if spec.tagged else None)
        plaintexts = layout.pack(full, tags)
        proof = b""
        if spec.tagged:
            ciphertexts = encrypt(self.public_key, plaintexts, self._randomness)
            batch = encode_batch(self.public_key, spec.sequence, ciphertexts)
        else:
            ciphertexts, exponents = encrypt_with_witness(self.public_key, plaintexts, self._randomness)
            batch = encode_batch(self.public_key, spec.sequence, ciphertexts)
            proof = prove_knowledge(self.public_key, self._randomness, ciphertexts, plaintexts,
                                    exponents, submission_context(self.public_key, self.client_id,
                                                                  spec.digest, batch))
        self._last_submitted[self.public_key.key_id] = spec.sequence
        unsigned = Submission(self.client_id, spec.digest, batch, proof=proof)
        signature = self._identity.sign(SUBMIT_DOMAIN + unsigned.signed_part())
        return encode(Submission(unsigned.client_id, unsigned.spec_digest, unsigned.batch, signature,
                                 proof))

    def receive_verification_keys(self, data: bytes) -> None:
        """Threshold custody: verify the dealer's signed verification keys (after the announcement)
        and that this client's share matches its key; then this client can act as a party.

        Taken once per (key id, key epoch): the same keys again change nothing (the party and its
        endorsement record stay), different ones raise ClientAbort(OTHER_KEYS). Whatever happens,
        the party records its endorsements in the one store this client was given."""
        if self._share is None or self.custody != THRESHOLD or self.public_key is None:
            raise ClientAbort(NOT_READY)
        try:
            directory = read_verification_keys(data, dealer_identity=self._announcer_identity,
                                               public_key=self.public_key, threshold=self.threshold)
            signed = tm.decode(data, tm.VerificationKeys).signed_part()
        except MalformedMessage:
            raise ClientAbort(BAD_KEYS) from None
        if self._party_keys is not None and self._party_keys[:2] == (self.public_key.key_id,
                                                                     self.epoch):
            if self._party_keys[2] != signed:
                raise ClientAbort(OTHER_KEYS)
            return
        try:
            party = DecryptionParty(self.client_id, identity=self._identity, share=self._share,
                                    roster=self._roster, directory=directory,
                                    store=self._endorsements)
        except InvalidArgumentError:
            raise ClientAbort(WRONG_SHARE) from None
        self._party, self._party_keys = party, (self.public_key.key_id, self.epoch, signed)

    def _party_ready(self) -> DecryptionParty:
        if self._party is None or self.custody != THRESHOLD:
            raise ClientAbort(NOT_READY)
        return self._party

    def endorse(self, data: bytes) -> bytes:
        """Threshold custody: sign one aggregation's contributor list (at most one per sequence)."""
        party = self._party_ready()
        try:
            listing = tm.decode(data, tm.ContributorList)
        except MalformedMessage:
            raise ClientAbort(BAD_REQUEST) from None
        return party.endorse(listing, self._spec(listing.spec))

    def decryption_share(self, data: bytes) -> bytes:
        """Threshold custody: check a certified request (a quorum of endorsements on its list, every
        submission signed, for this aggregation and proving knowledge of its plaintext) and return
        this party's decryption shares of the product with their proof."""
        party = self._party_ready()
        try:
            request = tm.decode(data, tm.CertifiedRequest)
        except MalformedMessage:
            raise ClientAbort(BAD_REQUEST) from None
        return party.decrypt(request, self._spec(request.spec))
