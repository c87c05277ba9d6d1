"""Threshold custody's one-time key ceremony: generate the key, split it, announce it, forget it.

The dealer is trusted only during set-up (in a deployment: a ceremony run by the auditor on an
offline machine). It keeps no copy of the private key once the shares exist; each share is
handed out once, to its party.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocols.paillier.messages import ANNOUNCE_DOMAIN, THRESHOLD, Announcement, encode
from secagg.errors import InvalidArgumentError
from secagg.keys import KEY_BYTES, SigningKey
from secagg.paillier import generate_keypair
from secagg.paillier.threshold import KeyShare, deal_shares


class ThresholdDealer:
    """Splits a fresh Paillier key t-of-N among ``parties`` (client ids, in share-index order).

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
        self.public_key, private_key = generate_keypair(key_bits, allow_insecure=allow_insecure)
        shares = deal_shares(private_key, parties=len(parties), threshold=threshold)
        del private_key
        self.threshold = threshold
        self.parties = tuple(parties)
        self._shares = dict(zip(parties, shares, strict=True))

    def announcement(self) -> bytes:
        unsigned = Announcement(THRESHOLD, self.public_key.to_bytes(), bytes(KEY_BYTES),
                                self.threshold)
        signature = self.identity.sign(ANNOUNCE_DOMAIN + unsigned.signed_part())
        return encode(Announcement(THRESHOLD, unsigned.public_key, unsigned.tag_public,
                                   self.threshold, signature))

    def hand_out(self, client_id: int) -> KeyShare:
        """Party ``client_id``'s share, exactly once."""
        share = self._shares.pop(client_id, None)
        if share is None:
            raise InvalidArgumentError(f"no share (left) for client {client_id}")
        return share
