"""Reading the dealer's signed verification keys (parties and server alike)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsec.protocols.errors import MalformedMessage
from fedsec.protocols.paillier import threshold_messages as tm
from fedsec.secagg.errors import CryptoError, InvalidArgumentError
from fedsec.secagg.keys import verify
from fedsec.secagg.paillier.keys import PaillierPublicKey
from fedsec.secagg.paillier.share_proofs import VerificationKeys


@dataclass(frozen=True)
class PartyDirectory:
    """The dealer's word on who holds which share: party ids in index order, t, and the keys."""

    parties: tuple[int, ...]
    threshold: int
    keys: VerificationKeys

    def index(self, client_id: int) -> int | None:
        """Share index (1..N) of ``client_id``, or None if it is not a party."""
        try:
            return self.parties.index(client_id) + 1
        except ValueError:
            return None


def read_verification_keys(data: bytes, *, dealer_identity: bytes, public_key: PaillierPublicKey,
                           threshold: int) -> PartyDirectory:
    """Verify the dealer's signature and the keys' form; MalformedMessage on anything wrong."""
    message = tm.decode(data, tm.VerificationKeys)
    try:
        verify(dealer_identity, message.signature, tm.KEYS_DOMAIN + message.signed_part())
    except CryptoError:
        raise MalformedMessage("verification keys: the dealer's signature does not verify") from None
    if message.key_id != public_key.key_id or message.threshold != threshold:
        raise MalformedMessage("verification keys: for another key or threshold")
    parties = tuple(message.parties)
    if len(set(parties)) != len(parties) or not 2 <= threshold <= len(parties):
        raise MalformedMessage("verification keys: party ids repeat or are fewer than t")
    width = public_key.ciphertext_bytes
    if any(len(raw) != width for raw in (message.base, *message.keys)):
        raise MalformedMessage("verification keys: a value has the wrong width")
    keys = VerificationKeys(int.from_bytes(message.base, "big"),
                            tuple(int.from_bytes(raw, "big") for raw in message.keys))
    try:
        keys.check(public_key, parties=len(parties))
    except InvalidArgumentError as error:
        raise MalformedMessage(f"verification keys: {error}") from None
    return PartyDirectory(parties, threshold, keys)
