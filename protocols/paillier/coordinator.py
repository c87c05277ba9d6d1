"""The server's side of threshold decryption: collect endorsements of one contributor list, ask
for decryption shares, check every party's proof, name the liars, combine the honest shares.

It holds only public values: the key, the dealer's verification keys, the parties' identity keys
and the submissions its :class:`~protocols.paillier.server.PaillierServer` accepted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
from fedsec.protocols.errors import MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.protocols.paillier.binding import quorum, share_context
from fedsec.protocols.paillier.server import PaillierServer
from fedsec.protocols.paillier.trust import PartyDirectory
from fedsec.secagg.errors import CryptoError, EncodingError, InvalidCiphertextError, ReconstructionError
from fedsec.secagg.keys import verify
from fedsec.secagg.paillier import decode_batch
from fedsec.secagg.paillier.share_proofs import verify_decryption
from fedsec.secagg.paillier.threshold import combine

MALFORMED = "malformed response"
BAD_PROOF = "decryption shares do not verify"
CARRY = ("a guard bit of the decrypted sum is set: a slot carried or overflowed (a contribution "
         "out of range); nothing released")


class ThresholdCoordinator:
    """Drives one aggregation's threshold decryption over ``server``'s accepted submissions.

    Args:
        server: the aggregation's server, its submissions all received.
        directory: the dealer's verified party list and verification keys.
        roster: client id -> Ed25519 identity public key (endorsements are checked with it).
    """

    def __init__(self, server: PaillierServer, *, directory: PartyDirectory,
                 roster: Mapping[int, bytes]) -> None:
        self.server, self.directory, self.roster = server, directory, dict(roster)
        self.spec = server.spec
        self.public_key = server.public_key
        submissions = server.submissions
        self.listing = tm.ContributorList(self.spec.to_bytes(), tuple(sorted(
            (c, hashlib.sha256(raw).digest()) for c, raw in submissions.items())))
        self.digest = self.listing.digest(self.public_key.key_id)
        self._submissions = tuple(submissions.values())
        self.quorum = quorum(len(directory.parties), directory.threshold)
        self.endorsements: dict[int, bytes] = {}
        self.liars: dict[int, str] = {}
        """Party client id -> why its decryption shares were refused."""

    def contributor_list(self) -> bytes:
        """The list every party is asked to endorse; ProtocolAbort below the threshold."""
        if len(self.listing.entries) < self.directory.threshold:
            raise ProtocolAbort(f"{len(self.listing.entries)} contributions; only sums of >= "
                                f"{self.directory.threshold} are decrypted")
        return tm.encode(self.listing)

    def add_endorsement(self, party: int, data: bytes) -> None:
        """Keep ``party``'s endorsement if it signs this list; MalformedMessage otherwise."""
        message = tm.decode(data, tm.Endorsement)
        if (message.party != party or party not in self.directory.parties
                or message.sequence != self.spec.sequence or message.list_digest != self.digest):
            raise MalformedMessage("endorsement from a non-party or of another list")
        try:
            verify(self.roster.get(party, b""), message.signature,
                   tm.ENDORSE_DOMAIN + message.signed_part())
        except CryptoError:
            raise MalformedMessage("endorsement signature does not verify") from None
        self.endorsements[party] = message.signature

    def request(self) -> bytes:
        """The certified request; ProtocolAbort with fewer than ``quorum`` endorsements."""
        if len(self.endorsements) < self.quorum:
            raise ProtocolAbort(f"{len(self.endorsements)} endorsements of the contributor list, "
                                f"need {self.quorum}")
        return tm.encode(tm.CertifiedRequest(self.spec.to_bytes(), self._submissions,
                                             tuple(sorted(self.endorsements.items()))))

    def _verified(self, party: int, data: bytes, product: list) -> list | None:
        index = self.directory.index(party)
        try:
            message = tm.decode(data, tm.VerifiedShares)
            if index is None or message.sequence != self.spec.sequence or message.party != index:
                raise MalformedMessage("decryption shares for another aggregation or party")
            shares = decode_batch(message.batch, self.public_key, round_index=self.spec.sequence,
                                  count=len(product))
        except (MalformedMessage, InvalidCiphertextError):
            self.liars[party] = MALFORMED
            return None
        try:
            verify_decryption(self.public_key, self.directory.keys, index, product, shares,
                              share_context(self.public_key, self.spec.sequence, self.digest),
                              message.proof, parties=len(self.directory.parties),
                              threshold=self.directory.threshold)
        except CryptoError:
            self.liars[party] = BAD_PROOF
            return None
        return shares

    def combine(self, responses: Mapping[int, bytes]) -> np.ndarray:
        """The summed words (count word last) from parties' responses (client id -> message).

        Every response's proof is checked; a party whose shares are malformed or do not verify is
        recorded in :attr:`liars` and left out. ProtocolAbort (naming the liars) if fewer than t
        verified responses remain; ProtocolAbort (:data:`CARRY`) if any slot's guard bit is set in
        the combined sum, padding slots included: the sum is never released.
        """
        product = self.server.product
        verified = {}
        for party, data in responses.items():
            shares = self._verified(party, data, product)
            if shares is not None:
                verified[self.directory.index(party)] = shares
        threshold = self.directory.threshold
        if len(verified) < threshold:
            raise ProtocolAbort(f"{len(verified)} verified decryption shares, need {threshold}; "
                                f"refused parties: {sorted(self.liars)}")
        try:
            plaintexts = combine(self.public_key, verified, parties=len(self.directory.parties),
                                 threshold=threshold)
            layout = self.spec.layout(self.public_key)
            words, _ = layout.unpack(plaintexts, self.spec.length)
        except (ReconstructionError, EncodingError) as error:
            raise ProtocolAbort(f"verified decryption shares do not combine: {error}") from None
        rows, _, _ = layout.unpack_rows(plaintexts)
        if (rows >> np.uint64(self.spec.slot_bits)).any():
            raise ProtocolAbort(CARRY)
        contributors = len(self.listing.entries)
        if int(words[-1]) != contributors or int(words.max()) > contributors * self.spec.word_bound:
            raise ProtocolAbort("the decrypted sum is not one the contributors can produce")
        return words
