"""A decrypting party of threshold custody: endorse one contributor list per aggregation, and help
decrypt only a list a quorum endorsed, whose every submission proves knowledge of its plaintext.

Agreement. A party signs at most one contributor list per aggregation sequence number, and
contributes decryption shares only to a list carrying valid endorsements from q = floor((N + t -
1) / 2) + 1 distinct parties (it records that list as its own endorsement, and refuses if it
endorsed another). Two lists for one sequence number would need 2 q - N > t - 1 common endorsers,
so at least one honest party signing both: impossible. The record lives in an
:class:`~protocols.paillier.state.EndorsementStore` that outlives this object (a durable one in a
deployment), so a rebuilt or restarted party still refuses a second list. Every honest client submits to one
sequence number only (its spec and batch are bound to it), so at most one sum holding any honest
ciphertext is ever decrypted.

Knowledge. Before decrypting, the party checks each submission's signature, aggregation, batch
and proof of plaintext knowledge bound to its submitter, so no submission is a function of another
client's ciphertext. Its own shares carry a proof against the dealer's verification key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import gmpy2
from fedsec.protocols.errors import ClientAbort, MalformedMessage
from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.protocols.paillier.binding import check_submission_proof, quorum, share_context
from fedsec.protocols.paillier.messages import SUBMIT_DOMAIN, Submission, decode
from fedsec.protocols.paillier.spec import RoundSpec
from fedsec.protocols.paillier.state import EndorsementConflict, EndorsementStore, MemoryEndorsementStore
from fedsec.protocols.paillier.trust import PartyDirectory
from fedsec.secagg.errors import CryptoError, InvalidArgumentError, InvalidCiphertextError
from fedsec.secagg.keys import SigningKey, verify
from fedsec.secagg.paillier import add_into, decode_batch, encode_batch
from fedsec.secagg.paillier.share_proofs import prove_decryption
from fedsec.secagg.paillier.threshold import KeyShare, decryption_shares

BAD_LIST = "contributor list malformed, too short or naming non-parties"
CONFLICT = "another contributor list was endorsed for this aggregation"
NO_QUORUM = "too few valid endorsements of this contributor list"
UNAUTHENTICATED = "a summed submission does not verify"
TOO_FEW = "fewer contributions than the threshold"


class DecryptionParty:
    """Party ``client_id``'s decryption side (it holds ``share``).

    Args:
        client_id: this party's client id.
        identity: its Ed25519 identity key (endorsements are signed with it).
        share: its key share.
        roster: client id -> Ed25519 identity public key of every client, the N parties included.
        directory: the dealer's verified party list and verification keys.
        store: where the endorsed list of each (key, sequence) is recorded (default: in memory,
            lost on exit). A party rebuilt or restarted on the same store refuses a second list
            of an aggregation it endorsed before; a deployment passes a durable one
            (``fedsec.state.SqliteEndorsementStore``).
    """

    def __init__(self, client_id: int, *, identity: SigningKey, share: KeyShare,
                 roster: Mapping[int, bytes], directory: PartyDirectory,
                 store: EndorsementStore | None = None) -> None:
        if directory.index(client_id) != share.index or len(directory.parties) != share.parties:
            raise InvalidArgumentError("the key share does not match the dealer's party list")
        n_square = share.public_key.n_square
        if gmpy2.powmod(directory.keys.base, share.exponent, n_square) != directory.keys.keys[
                share.index - 1]:
            raise InvalidArgumentError("the key share does not match its verification key")
        if any(p not in roster for p in directory.parties):
            raise InvalidArgumentError("a party has no identity key in the roster")
        self.client_id, self._identity, self._share = client_id, identity, share
        self._roster, self.directory = dict(roster), directory
        self.quorum = quorum(share.parties, share.threshold)
        self.store: EndorsementStore = store if store is not None else MemoryEndorsementStore()

    @property
    def public_key(self):
        return self._share.public_key

    def _record(self, sequence: int, digest: bytes) -> None:
        try:
            self.store.endorse(self.public_key.key_id, sequence, digest)
        except (EndorsementConflict, ValueError):
            raise ClientAbort(CONFLICT) from None

    def endorse(self, listing: tm.ContributorList, spec: RoundSpec) -> bytes:
        """Sign ``listing`` (for the verified ``spec``) unless another list of its aggregation was."""
        ids = [client_id for client_id, _ in listing.entries]
        if (not self._share.threshold <= len(ids) <= spec.max_contributions
                or ids != sorted(set(ids)) or any(c not in self._roster for c in ids)):
            raise ClientAbort(BAD_LIST)
        digest = listing.digest(self.public_key.key_id)
        self._record(spec.sequence, digest)
        unsigned = tm.Endorsement(self.client_id, spec.sequence, digest)
        signature = self._identity.sign(tm.ENDORSE_DOMAIN + unsigned.signed_part())
        return tm.encode(tm.Endorsement(self.client_id, spec.sequence, digest, signature))

    def _submissions(self, request: tm.CertifiedRequest, spec: RoundSpec
                     ) -> tuple[list[Submission], tm.ContributorList]:
        try:
            parsed = [decode(raw, Submission) for raw in request.submissions]
        except MalformedMessage:
            raise ClientAbort(UNAUTHENTICATED) from None
        if not self._share.threshold <= len(parsed) <= spec.max_contributions:
            raise ClientAbort(TOO_FEW)
        entries = sorted((s.client_id, hashlib.sha256(raw).digest())
                         for s, raw in zip(parsed, request.submissions, strict=True))
        ids = [client_id for client_id, _ in entries]
        if len(set(ids)) != len(ids) or any(c not in self._roster for c in ids):
            raise ClientAbort(UNAUTHENTICATED)
        return parsed, tm.ContributorList(request.spec, tuple(entries))

    def _check_quorum(self, request: tm.CertifiedRequest, sequence: int, digest: bytes) -> None:
        endorsers = set()
        for party, signature in request.endorsements:
            if party in endorsers or party not in self.directory.parties:
                continue
            try:
                verify(self._roster[party], signature, tm.ENDORSE_DOMAIN
                       + tm.Endorsement(party, sequence, digest).signed_part())
            except CryptoError:
                continue
            endorsers.add(party)
        if len(endorsers) < self.quorum:
            raise ClientAbort(NO_QUORUM)

    def decrypt(self, request: tm.CertifiedRequest, spec: RoundSpec) -> bytes:
        """This party's verified decryption shares of the product of ``request``'s submissions."""
        parsed, listing = self._submissions(request, spec)
        digest = listing.digest(self.public_key.key_id)
        self._check_quorum(request, spec.sequence, digest)
        self._record(spec.sequence, digest)
        public_key, count = self.public_key, spec.ciphertexts(self.public_key)
        total = None
        for submission in parsed:
            try:
                verify(self._roster[submission.client_id], submission.signature,
                       SUBMIT_DOMAIN + submission.signed_part())
                if submission.spec_digest != spec.digest:
                    raise CryptoError()
                values = decode_batch(submission.batch, public_key, round_index=spec.sequence,
                                      count=count)
                check_submission_proof(public_key, submission, values)
            except (CryptoError, InvalidCiphertextError):
                raise ClientAbort(UNAUTHENTICATED) from None
            if total is None:
                total = values
            else:
                add_into(total, values, public_key)
        shares = decryption_shares(self._share, total)
        proof = prove_decryption(self._share, self.directory.keys, total, shares,
                                 share_context(public_key, spec.sequence, digest))
        return tm.encode(tm.VerifiedShares(spec.sequence, self._share.index,
                                           encode_batch(public_key, spec.sequence, shares), proof))
