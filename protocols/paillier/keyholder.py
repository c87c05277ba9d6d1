"""The key holder: the only party with the Paillier decryption key, and what it refuses.

It is a role apart from the server (an auditor, or one designated hospital). Who may lie: the
server (any request, any ciphertexts it can form from the public key and the clients'
ciphertexts), together with up to t - 1 enrolled clients. What it must never get: a decryption of
anything but the sum of at least t distinct registered clients' ciphertexts for one aggregation,
each taken once, and never two sums of one aggregation. What it must never learn from a refusal:
anything about a plaintext.

A request is handled in this order:

1. It must parse and carry a valid Ed25519 signature of the server's identity. Otherwise it is
   refused and nothing changes (junk from anyone else burns nothing).
2. Its sequence number must be exactly the next after the last one burned (persisted in a
   :class:`~protocols.paillier.state.SequenceStore`). Otherwise refused, nothing changes. Then
   the number is burned, durably, before anything is decrypted: the server gets at most one
   decryption attempt per aggregation, and a probe spends the real round (the round aborts,
   visibly).
3. The checks that depend only on what the server already knows (contributors distinct,
   registered, a tagged spec bound to a roster, the request's roster names canonical and hashing
   to the spec's roster digest, every contributor enrolled under a name of that roster,
   t <= |S| <= the spec's maximum, a valid batch of the right count under this key for this
   sequence).
4. Every ciphertext is decrypted and unpacked, and every plaintext-dependent check is evaluated,
   each over all ciphertexts, and only then combined: all values in range, the MAC (tag) of every
   plaintext, the count word, every word within what |S| clients can sum to. No early exit.

Why the roster (review S5-1): a client provisions its client-level noise share for the colluders
its own plan tolerates among ITS roster, so a sum may count only that roster's sites. The spec's
roster digest enters every honest client's tags (a client submits only under its own plan's
digest), so a sum passes the tag check only if every honest contributor agreed to the digest the
request names; the key holder then refuses any contributor whose enrolled name (for a deployment:
the name in its certificate) the digest's roster does not hold, whoever enrolled it.

Every refusal is the same: :class:`DecryptionRefused` with one fixed message, or on the wire the
fieldless :class:`~protocols.paillier.messages.Refusal`. Which rule fired goes only to the key
holder's own record (:attr:`PaillierKeyHolder.refusals`), which is never sent.
"""

from __future__ import annotations

import os
from collections import deque

from fedsec.protocols.errors import MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier.messages import (
    ANNOUNCE_DOMAIN,
    KEY_HOLDER,
    REGISTER_DOMAIN,
    REQUEST_DOMAIN,
    Announcement,
    DecryptionRequest,
    DecryptionResult,
    Refusal,
    Registration,
    Welcome,
    decode,
    encode,
)
from fedsec.protocols.paillier.spec import (
    NO_ROSTER,
    RoundSpec,
    canonical_roster,
    roster_digest,
    round_coefficients,
    round_tags,
    tag_key,
    welcome_associated,
    wrap_key,
)
from fedsec.protocols.paillier.state import MemorySequenceStore, SequenceStore, StaleSequence
from fedsec.secagg.errors import CryptoError, InvalidArgumentError, InvalidCiphertextError
from fedsec.secagg.keys import KEY_BYTES, KeyPair, SigningKey, seal, verify
from fedsec.secagg.paillier import PaillierPrivateKey, decode_batch, decrypt, generate_keypair
from fedsec.secagg.paillier.packing import MAC_PRIME, slot_forms

REFUSAL = encode(Refusal())
"""The one refusal the key holder sends, whatever the reason."""
_REFUSED = "the key holder refused to decrypt"
REFUSAL_RECORD = 1000
"""How many refusals the key holder's own record keeps (the oldest are dropped)."""


def default_name(client_id: int) -> str:
    """The roster name of a client enrolled without one (the simulation's clients)."""
    return f"client-{client_id}"


class DecryptionRefused(ProtocolAbort):
    """The key holder would not decrypt. Always the same message; nothing was released."""

    def __init__(self) -> None:
        super().__init__(_REFUSED)


class PaillierKeyHolder:
    """Generates the Paillier key, enrolls clients, and decrypts authenticated aggregates only.

    Args:
        threshold: fewest contributions it will decrypt a sum of, >= 2.
        server_identity: the server's Ed25519 public key (32 bytes, known out of band); every
            decryption request must be signed by it.
        key_bits: Paillier modulus size (2048 or 3072; 512/1024 only with ``allow_insecure``).
        identity: its Ed25519 identity key (clients know the public half beforehand).
        epoch: key epoch in its announcement, >= 1 (a new key must come with a higher one).
        store: where the burned sequence numbers live (default: in memory, lost on exit).
        private_key, tag_secret, mac_key: a restarted key holder's own secrets (its Paillier
            private key, X25519 tag private key, 32-byte group MAC key); fresh ones if omitted.
    """

    def __init__(self, *, threshold: int, server_identity: bytes, key_bits: int = 2048,
                 identity: SigningKey | None = None, epoch: int = 1,
                 store: SequenceStore | None = None, private_key: PaillierPrivateKey | None = None,
                 tag_secret: bytes | None = None, mac_key: bytes | None = None,
                 allow_insecure: bool = False) -> None:
        if threshold < 2:
            raise InvalidArgumentError(f"threshold must be >= 2, got {threshold}")
        if not isinstance(server_identity, bytes) or len(server_identity) != KEY_BYTES:
            raise InvalidArgumentError(f"server_identity must be {KEY_BYTES} bytes")
        if not 1 <= epoch < 1 << 64:
            raise InvalidArgumentError(f"epoch must be in [1, 2^64), got {epoch}")
        if mac_key is not None and len(mac_key) != KEY_BYTES:
            raise InvalidArgumentError(f"mac_key must be {KEY_BYTES} bytes")
        self.threshold, self.epoch = threshold, epoch
        self.server_identity = server_identity
        self.identity = identity or SigningKey.generate()
        if private_key is None:
            self.public_key, self._private_key = generate_keypair(key_bits,
                                                                  allow_insecure=allow_insecure)
        else:
            self.public_key, self._private_key = private_key.public_key, private_key
        self._tag_pair = KeyPair.generate() if tag_secret is None else KeyPair.from_private(tag_secret)
        self._mac_key = mac_key or os.urandom(KEY_BYTES)
        self.store: SequenceStore = store if store is not None else MemorySequenceStore()
        self._roster: dict[int, bytes] = {}
        self._names: dict[int, str] = {}
        """Client id -> the roster name it was enrolled under (one name per id, one id per name)."""
        self._ids: dict[str, int] = {}
        self._tag_keys: dict[int, bytes] = {}
        self._registered: dict[int, set[bytes]] = {}
        """Every tag key each client registered under this key and epoch (replays are refused)."""
        self._current_tag: dict[int, bytes] = {}
        self.withdrawn: set[int] = set()
        """Clients whose enrolment was withdrawn (:meth:`withdraw`): they no longer count."""
        self.decryptions = 0
        self.refusals: deque[tuple[int | None, str]] = deque(maxlen=REFUSAL_RECORD)
        """The key holder's own record of the last :data:`REFUSAL_RECORD` (sequence or None,
        reason): never sent to anyone, bounded so junk cannot grow it without limit."""

    @property
    def last_sequence(self) -> int:
        """The last burned sequence number of this key."""
        return self.store.last_burned(self.public_key.key_id)

    def enroll(self, client_id: int, identity_public: bytes, *, name: str | None = None) -> None:
        """Admit a client's identity key (out of band: a certificate, an administrator) under its
        roster ``name`` (a deployment: the site's certificate name; default
        :func:`default_name`). An id keeps its key and name, and a name its id, forever:
        InvalidArgumentError otherwise (nothing changes)."""
        name = default_name(client_id) if name is None else name
        if self._roster.get(client_id, identity_public) != identity_public or \
                self._names.get(client_id, name) != name:
            raise InvalidArgumentError(f"client {client_id} is enrolled with another identity key or name")
        if self._ids.get(name, client_id) != client_id:
            raise InvalidArgumentError(f"the name {name!r} is enrolled under another client id")
        self._roster[client_id], self._names[client_id], self._ids[name] = identity_public, name, client_id
        self.withdrawn.discard(client_id)

    def withdraw(self, client_id: int) -> None:
        """Stop counting ``client_id`` (its certificate was revoked, or it is off the operator's
        site list): its registration is refused and every decryption naming it is refused (the
        sequence number burned), until it is enrolled again. Its id and name stay bound."""
        self._roster.pop(client_id, None)
        self._tag_keys.pop(client_id, None)
        self._current_tag.pop(client_id, None)
        self.withdrawn.add(client_id)

    def announcement(self) -> bytes:
        """The signed key announcement every client checks before registering."""
        unsigned = Announcement(KEY_HOLDER, self.public_key.to_bytes(), self._tag_pair.public,
                                self.threshold, epoch=self.epoch)
        signature = self.identity.sign(ANNOUNCE_DOMAIN + unsigned.signed_part())
        return encode(Announcement(KEY_HOLDER, unsigned.public_key, unsigned.tag_public,
                                   self.threshold, signature, self.epoch))

    def register(self, data: bytes) -> bytes:
        """Accept an enrolled client's signed tag key; returns that client's Welcome (the group
        MAC key sealed for it). Raises MalformedMessage otherwise."""
        message = decode(data, Registration)
        identity = self._roster.get(message.client_id)
        if identity is None:
            raise MalformedMessage(f"client {message.client_id} is not enrolled")
        if message.key_id != self.public_key.key_id or message.epoch != self.epoch:
            raise MalformedMessage("registration is for another Paillier key or key epoch")
        try:
            verify(identity, message.signature, REGISTER_DOMAIN + message.signed_part())
            shared = self._tag_pair.agree(message.tag_public)
        except CryptoError:
            raise MalformedMessage("registration does not verify") from None
        key_id, client_id = self.public_key.key_id, message.client_id
        seen = self._registered.setdefault(client_id, set())
        if message.tag_public in seen and message.tag_public != self._current_tag[client_id]:
            # A registration the client has since replaced (it restarted and registered anew): a
            # replay would swap its pad key back and lock it out of every later aggregation.
            raise MalformedMessage("registration was replaced by a newer one")
        seen.add(message.tag_public)
        self._current_tag[client_id] = message.tag_public
        self._tag_keys[client_id] = tag_key(shared, key_id, client_id)
        sealed = seal(wrap_key(shared, key_id, self.epoch, client_id), self._mac_key,
                      welcome_associated(key_id, self.epoch, client_id))
        return encode(Welcome(client_id, key_id, self.epoch, sealed))

    def respond(self, data: bytes) -> bytes:
        """What goes back on the wire: the DecryptionResult, or :data:`REFUSAL`."""
        try:
            return self.decrypt(data)
        except DecryptionRefused:
            return REFUSAL

    def _refuse(self, sequence: int | None, reason: str) -> DecryptionRefused:
        self.refusals.append((sequence, reason))
        return DecryptionRefused()

    def decrypt(self, data: bytes) -> bytes:
        """Check and decrypt one aggregate; returns the DecryptionResult message or raises
        DecryptionRefused (always the same)."""
        try:
            request = decode(data, DecryptionRequest)
            verify(self.server_identity, request.signature, REQUEST_DOMAIN + request.signed_part())
            spec = RoundSpec.from_bytes(request.spec)
        except (MalformedMessage, CryptoError):
            raise self._refuse(None, "malformed, or not signed by the server") from None
        key_id = self.public_key.key_id
        expected = self.store.last_burned(key_id) + 1
        if spec.sequence != expected:
            raise self._refuse(spec.sequence, f"not the next sequence number ({expected})")
        try:
            self.store.burn(key_id, spec.sequence)
        except StaleSequence:
            raise self._refuse(spec.sequence, "burned concurrently") from None
        contributors = request.participants
        structure = self._structure_problem(spec, contributors, request.roster)
        if structure:
            raise self._refuse(spec.sequence, structure)
        layout = spec.layout(self.public_key)
        count = layout.ciphertexts_for(spec.length)
        try:
            values = decode_batch(request.batch, self.public_key, round_index=spec.sequence,
                                  count=count)
        except InvalidCiphertextError:
            raise self._refuse(spec.sequence, "invalid ciphertext batch") from None
        rows, tops, in_range = layout.unpack_rows(decrypt(self._private_key, values))
        failed = self._plaintext_checks(spec, contributors, rows, tops, in_range)
        if failed:
            raise self._refuse(spec.sequence, "; ".join(failed))
        self.decryptions += 1
        words = rows.reshape(-1)[: spec.length].copy()
        return encode(DecryptionResult(spec.sequence, contributors, words))

    def _structure_problem(self, spec: RoundSpec, contributors: tuple[int, ...],
                           roster: tuple[str, ...]) -> str:
        """What is wrong with the request's form (all known to the server), or ''."""
        if len(set(contributors)) != len(contributors):
            return "a contributor is listed twice"
        if any(c in self.withdrawn for c in contributors):
            return "a contributor's enrolment was withdrawn (revoked, or off the key holder's sites)"
        if any(c not in self._tag_keys for c in contributors):
            return "a contributor is not registered"
        if not spec.tagged:
            return "the aggregate carries no integrity tags"
        roster_problem = self._roster_problem(spec, contributors, roster)
        if roster_problem:
            return roster_problem
        if not self.threshold <= len(contributors) <= spec.max_contributions:
            return (f"{len(contributors)} contributors, need between {self.threshold} and "
                    f"{spec.max_contributions}")
        try:
            spec.layout(self.public_key)
        except InvalidArgumentError:
            return "the layout does not fit this key"
        return ""

    def _roster_problem(self, spec: RoundSpec, contributors: tuple[int, ...],
                        roster: tuple[str, ...]) -> str:
        """Whether the request's roster is the spec's and holds every contributor's name, or ''."""
        if spec.roster == NO_ROSTER:
            return "the spec is bound to no roster"
        try:
            if canonical_roster(roster) != roster:
                return "the roster's names are not in canonical (sorted) order"
            if roster_digest(roster) != spec.roster:
                return "the roster's names do not hash to the spec's roster digest"
        except MalformedMessage:
            return "the roster is malformed (an empty, repeated or oversized name)"
        names = {self._names[c] for c in contributors}
        if len(names) != len(contributors):
            return "two contributors are enrolled under one name"
        outside = names.difference(roster)
        if outside:
            return f"{len(outside)} contributor(s) enrolled under a name outside the spec's roster"
        return ""

    def _plaintext_checks(self, spec: RoundSpec, contributors: tuple[int, ...], rows, tops,
                          in_range: bool) -> list[str]:
        """Every plaintext-dependent rule, each evaluated in full before any is reported."""
        count, size = len(tops), len(contributors)
        layout = spec.layout(self.public_key)
        forms = slot_forms(rows, round_coefficients(self._mac_key, spec, layout, count))
        pads = [0] * count
        for c in contributors:
            for k, b in enumerate(round_tags(self._tag_keys[c], spec, count)):
                pads[k] += b
        tags_ok = True
        for top, form, pad in zip(tops, forms, pads, strict=True):
            tags_ok &= (top < size * MAC_PRIME) & ((top - form - pad) % MAC_PRIME == 0)
        words = rows.reshape(-1)
        count_ok = int(words[spec.length - 1]) == size
        bound_ok = int(words[: spec.length].max()) <= size * spec.word_bound
        padding_ok = not words[spec.length :].any()
        checks = {"a plaintext outside the packed range": in_range, "tags": tags_ok,
                  "count word": count_ok, "word bound": bound_ok, "padding": padding_ok}
        return [name for name, ok in checks.items() if not ok]
