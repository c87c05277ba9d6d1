"""The server of the Paillier protocol: validate each submission, multiply it into the sum.

It holds only the public key. A submission is parsed and every ciphertext validated
(:func:`secagg.paillier.decode_batch`), and under threshold custody its proof of plaintext
knowledge checked, before it touches the running product, so a refused one changes nothing; a
client that never sends is simply not in the sum. Threshold decryption is driven by
:class:`protocols.paillier.coordinator.ThresholdCoordinator`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import gmpy2
import numpy as np
from fedsec.protocols.errors import MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier.binding import check_submission_proof
from fedsec.protocols.paillier.keyholder import DecryptionRefused
from fedsec.protocols.paillier.messages import (
    REQUEST_DOMAIN,
    SUBMIT_DOMAIN,
    DecryptionRequest,
    DecryptionResult,
    Refusal,
    Submission,
    decode,
    encode,
)
from fedsec.protocols.paillier.spec import NO_ROSTER, RoundSpec, canonical_roster, roster_digest
from fedsec.secagg.errors import CryptoError, InvalidArgumentError, InvalidCiphertextError
from fedsec.secagg.keys import SigningKey, verify
from fedsec.secagg.paillier import PaillierPublicKey, add_into, decode_batch, encode_batch


class PaillierServer:
    """Collects one aggregation.

    Args:
        public_key: the key holder's announced key.
        spec: this aggregation's parameters (sent to every client).
        expected: ids of the clients asked to contribute.
        threshold: the announced minimum number of contributions (and, under threshold custody,
            of decryption shares).
        identities: client id -> Ed25519 identity key; each submission's signature is checked.
        identity: the server's own Ed25519 identity key, which signs decryption requests
            (key-holder custody; the key holder refuses unsigned ones).
        roster: key-holder custody: the names of the roster whose :func:`roster_digest` is
            ``spec.roster``, sent with the decryption request (sorted here); ignored under
            threshold custody. InvalidArgumentError if they do not hash to the spec's digest.
    """

    def __init__(self, public_key: PaillierPublicKey, spec: RoundSpec, *, expected: Iterable[int],
                 threshold: int, identities: Mapping[int, bytes],
                 identity: SigningKey | None = None, roster: Sequence[str] = ()) -> None:
        self.public_key, self.spec, self.threshold = public_key, spec, threshold
        self.identity = identity
        self.roster: tuple[str, ...] = ()
        if spec.tagged and spec.roster != NO_ROSTER:
            try:
                self.roster = canonical_roster(roster)
                if roster_digest(self.roster) != spec.roster:
                    raise MalformedMessage("digest")
            except MalformedMessage:
                raise InvalidArgumentError("roster: the names do not hash to the spec's roster digest") \
                    from None
        self.expected = frozenset(expected)
        self.identities = dict(identities)
        self._submissions: list[bytes] = []
        self.count = spec.ciphertexts(public_key)
        self.participants: list[int] = []
        self.rejected: dict[int, str] = {}
        self._total: list[gmpy2.mpz] | None = None

    def receive(self, client_id: int, data: bytes) -> None:
        """Validate ``client_id``'s submission and add it; raises MalformedMessage if refused."""
        try:
            message = decode(data, Submission)
            if message.client_id != client_id:
                raise MalformedMessage("submission names another client")
            if client_id not in self.expected or client_id in self.participants:
                raise MalformedMessage("submission from a client not asked or already counted")
            if message.spec_digest != self.spec.digest:
                raise MalformedMessage("submission is for another aggregation")
            try:
                verify(self.identities.get(client_id, b""), message.signature,
                       SUBMIT_DOMAIN + message.signed_part())
            except CryptoError:
                raise MalformedMessage("submission signature does not verify") from None
            values = decode_batch(message.batch, self.public_key, round_index=self.spec.sequence,
                                  count=self.count)
            if not self.spec.tagged:
                try:
                    check_submission_proof(self.public_key, message, values)
                except CryptoError:
                    raise MalformedMessage("proof of plaintext knowledge does not verify") from None
        except (MalformedMessage, InvalidCiphertextError) as error:
            self.rejected[client_id] = str(error)
            raise MalformedMessage(f"submission of client {client_id} refused: {error}") from error
        if self._total is None:
            self._total = values
        else:
            add_into(self._total, values, self.public_key)
        self.participants.append(client_id)
        self._submissions.append(bytes(data))

    def _check_enough(self) -> None:
        if self._total is None or len(self.participants) < self.threshold:
            raise ProtocolAbort(f"{len(self.participants)} contributions; only sums of >= "
                                f"{self.threshold} are decrypted")

    def decryption_request(self) -> bytes:
        """Key-holder custody: the signed request; ProtocolAbort if fewer than ``threshold``
        contributed, ValueError (naming ``identity``) if the server has no identity key."""
        self._check_enough()
        return self._signed_request(tuple(self.participants),
                                    encode_batch(self.public_key, self.spec.sequence, self._total))

    def void_request(self) -> bytes:
        """Key-holder custody: a signed request with no contributors, sent when the aggregation
        aborts before decryption. The key holder burns its sequence number and refuses it, so the
        next aggregation's number is the next one it accepts."""
        return self._signed_request((), b"")

    def _signed_request(self, participants: tuple[int, ...], batch: bytes) -> bytes:
        if self.identity is None:
            raise ValueError("identity: the server needs its signing key to ask the key holder")
        unsigned = DecryptionRequest(self.spec.to_bytes(), participants, batch, roster=self.roster)
        signature = self.identity.sign(REQUEST_DOMAIN + unsigned.signed_part())
        return encode(DecryptionRequest(unsigned.spec, participants, batch, signature, self.roster))

    def finish(self, data: bytes) -> np.ndarray:
        """The summed words (count word last) from the key holder's answer.

        Raises :class:`~protocols.paillier.keyholder.DecryptionRefused` on the key holder's
        refusal and ProtocolAbort on an answer that is neither a result nor a refusal, or does not
        match the request (both ``fl_core`` AggregationErrors: the round is recorded as aborted)."""
        try:
            result = decode(data, DecryptionResult)
        except MalformedMessage:
            try:
                decode(data, Refusal)
            except MalformedMessage:
                raise ProtocolAbort("the key holder's answer is malformed") from None
            raise DecryptionRefused() from None
        if (result.sequence != self.spec.sequence or result.participants != tuple(self.participants)
                or result.words.size != self.spec.length):
            raise ProtocolAbort("the key holder's result does not match the request")
        return result.words

    @property
    def submissions(self) -> dict[int, bytes]:
        """Client id -> the accepted submission message, in arrival order."""
        return dict(zip(self.participants, self._submissions, strict=True))

    @property
    def product(self) -> list[gmpy2.mpz]:
        """The product of the accepted ciphertexts (a copy); ProtocolAbort below the threshold."""
        self._check_enough()
        return list(self._total)
