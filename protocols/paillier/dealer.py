"""Threshold custody's one-time key ceremony: generate the key, split it, announce it, forget it.

The dealer is trusted only during set-up (in a deployment: a ceremony run by the auditor on an
offline machine). It draws a safe-prime modulus (so decryption shares can be verified), keeps no
copy of the private key once the shares exist, hands each share out once, to its party, and
publishes signed verification keys v, v_i = v^(D s_i) with which anyone checks a party's
decryption shares.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.protocols.paillier.messages import ANNOUNCE_DOMAIN, THRESHOLD, Announcement, encode
from fedsec.secagg.errors import InvalidArgumentError
from fedsec.secagg.keys import KEY_BYTES, SigningKey
from fedsec.secagg.paillier.safe_keys import generate_safe_keypair
from fedsec.secagg.paillier.share_proofs import make_verification_keys
from fedsec.secagg.paillier.threshold import KeyShare, deal_shares


class ThresholdDealer:
    """Splits a fresh safe-prime Paillier key t-of-N among ``parties`` (client ids, in share-index
    order).

    Args:
        parties: the N client ids that will hold shares, distinct.
        threshold: t in [2, N].
        key_bits: Paillier modulus size (2048 or 3072; 512/1024 only with ``allow_insecure``).
    """

    def __init__(self, *, parties: Sequence[int], threshold: int, key_bits: int = 2048,
                 identity: SigningKey | None = None, allow_insecure: bool = False) -> None:
        parties = list(parties)
        if len(set(parties)) != len(parties):
            raise InvalidArgumentError("party ids must be distinct")
        self.identity = identity or SigningKey.generate()
        self.public_key, private_key = generate_safe_keypair(key_bits, allow_insecure=allow_insecure)
        shares = deal_shares(private_key, parties=len(parties), threshold=threshold)
        del private_key
        self.threshold = threshold
        self.parties = tuple(parties)
        self.keys = make_verification_keys(shares)
        self._shares = dict(zip(parties, shares, strict=True))

    def announcement(self) -> bytes:
        unsigned = Announcement(THRESHOLD, self.public_key.to_bytes(), bytes(KEY_BYTES),
                                self.threshold)
        signature = self.identity.sign(ANNOUNCE_DOMAIN + unsigned.signed_part())
        return encode(Announcement(THRESHOLD, unsigned.public_key, unsigned.tag_public,
                                   self.threshold, signature))

    def verification_keys(self) -> bytes:
        """The signed :class:`~protocols.paillier.threshold_messages.VerificationKeys` message."""
        width = self.public_key.ciphertext_bytes
        unsigned = tm.VerificationKeys(self.public_key.key_id, self.threshold, self.parties,
                                       self.keys.base.to_bytes(width, "big"),
                                       tuple(k.to_bytes(width, "big") for k in self.keys.keys))
        signature = self.identity.sign(tm.KEYS_DOMAIN + unsigned.signed_part())
        return tm.encode(tm.VerificationKeys(unsigned.key_id, unsigned.threshold, unsigned.parties,
                                             unsigned.base, unsigned.keys, signature))

    def hand_out(self, client_id: int) -> KeyShare:
        """Party ``client_id``'s share, exactly once."""
        share = self._shares.pop(client_id, None)
        if share is None:
            raise InvalidArgumentError(f"no share (left) for client {client_id}")
        return share
