"""Threshold custody over the network: the sites hold the key shares and decrypt the sum.

The shares come from the auditor's ceremony (:mod:`fedsec.network.layers.paillier_dealer`); each
site keeps its own in ``STATE_DIR/paillier.share`` and its endorsement record in
``STATE_DIR/endorsements.db`` (:class:`fedsec.state.SqliteEndorsementStore`: a site that
restarts still refuses a second contributor list of an aggregation it endorsed). The coordinator
holds only public values; it learns the dealing (announcement, verification keys, dealer
certificate) from the sites on its first aggregation (``paillier/hello``) and checks each itself:
the dealer's certificate against the root (role ``keyholder``, name
``federation.keyholder_name``), the signatures, the threshold and the roster; of the dealings
that verify it takes the one most sites hold (a site replaying an older dealing of the same
auditor cannot swap the key for the others: its own submissions then fail and it drops out).
The sites also report the last sequence number they endorsed under the dealing (their durable
record); the coordinator numbers on from the t-th highest report, so a new run, or a restarted
coordinator, on the same dealing does not reuse a number (a site that lies about it can only get
rounds refused, never a second list endorsed).

Stages per aggregation: ``paillier/submit`` (spec -> signed submission with its proof of
plaintext knowledge), ``paillier/endorse`` (the contributor list -> the party's signature, at most
one list per sequence number), ``paillier/decrypt`` (the certified request -> verified decryption
shares, from the contributors). Every party that endorses or decrypts checks what
:class:`~fedsec.protocols.paillier.party.DecryptionParty` checks, unchanged.

Limits: only the sites of the aggregation are asked to endorse (a site the round did not sample
runs no layer for it), so with ``train.fraction < 1`` a round needs a quorum among the sampled
sites; the roster's identity keys are the dealer's (from the certificates it verified), so a
site re-enrolled with a new certificate needs a new dealing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from fedsec.network import envelope
from fedsec.network.errors import PeerRejected
from fedsec.network.keyholder import raw_identity
from fedsec.network.layers.base import CoordinatorContext, SiteContext, first_message
from fedsec.network.layers.paillier import (
    BAD_SETUP,
    SITE_CLIENTS,
    SiteClient,
    SiteEncoding,
    _Custody,
    round_spec,
)
from fedsec.network.layers.paillier_dealer import SHARE_FILE, dealer_identity, load_share
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier import PaillierClient, PaillierServer, RoundSpec, ThresholdCoordinator
from fedsec.protocols.paillier.messages import ANNOUNCE_DOMAIN, THRESHOLD, Announcement, decode
from fedsec.protocols.paillier.spec import NO_CONTEXT
from fedsec.protocols.paillier.trust import PartyDirectory, read_verification_keys
from fedsec.secagg.errors import CryptoError
from fedsec.secagg.keys import verify
from fedsec.secagg.paillier import PaillierPublicKey
from fedsec.state.endorsements import SqliteEndorsementStore

HELLO, SUBMIT, ENDORSE, DECRYPT = "paillier/hello", "paillier/submit", "paillier/endorse", "paillier/decrypt"
NO_SHARE = "this site holds no key share for the plan's roster (STATE_DIR/paillier.share)"
LAST_USED: dict[bytes, int] = {}
"""Paillier key id -> the last sequence number this coordinator process used under it: shared by
every instance of the layer (the training's and the evaluation's), so none reuses a number."""


class PerCallEndorsements:
    """:class:`SqliteEndorsementStore` opened for each call (a site may call from any thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        SqliteEndorsementStore(path).close()

    def last_sequence(self, key_id: bytes) -> int:
        """The highest sequence number endorsed under ``key_id`` (0 if none)."""
        db = sqlite3.connect(self.path)
        try:
            row = db.execute("SELECT MAX(sequence) FROM endorsed WHERE key_id = ?",
                             (bytes(key_id),)).fetchone()
        finally:
            db.close()
        return 0 if row is None or row[0] is None else int.from_bytes(row[0], "big")

    def endorsed(self, key_id: bytes, sequence: int) -> bytes | None:
        store = SqliteEndorsementStore(self.path)
        try:
            return store.endorsed(key_id, sequence)
        finally:
            store.close()

    def endorse(self, key_id: bytes, sequence: int, digest: bytes) -> None:
        store = SqliteEndorsementStore(self.path)
        try:
            store.endorse(key_id, sequence, digest)
        finally:
            store.close()


class ThresholdCustody(_Custody):
    """The coordinator's side of threshold custody (see the module)."""

    def __init__(self, context: CoordinatorContext, threshold: int) -> None:
        if context.trust is None:
            raise ValueError("trust: threshold custody checks the dealer's certificate")
        self.context, self.threshold = context, threshold
        self.why: dict[int, str] = {}
        self.public_key: PaillierPublicKey | None = None
        self.directory: PartyDirectory | None = None
        self._sequence = 0

    def _dealing(self, data: bytes) -> tuple[PaillierPublicKey, PartyDirectory, int]:
        """A site's dealing, checked (dealer certificate, signatures, threshold, roster), and the
        last sequence number the site endorsed under it."""
        ctx = self.context
        header, _ = envelope.decode(data)
        last = envelope.field(header, "last_sequence", int)
        if not 0 <= last < 1 << 62:
            raise MalformedMessage("last_sequence out of range")
        announcement = bytes.fromhex(envelope.field(header, "announcement", str))
        keys = bytes.fromhex(envelope.field(header, "keys", str))
        dealer = dealer_identity(envelope.field(header, "dealer", str).encode(), trust=ctx.trust,
                                 name=ctx.config.federation.keyholder_name)
        message = decode(announcement, Announcement)
        try:
            verify(dealer, message.signature, ANNOUNCE_DOMAIN + message.signed_part())
        except CryptoError:
            raise MalformedMessage("announcement does not verify") from None
        if message.custody != THRESHOLD or message.threshold != self.threshold:
            raise MalformedMessage("a dealing for another custody or threshold")
        public_key = PaillierPublicKey.from_bytes(message.public_key)
        directory = read_verification_keys(keys, dealer_identity=dealer, public_key=public_key,
                                           threshold=self.threshold)
        if directory.parties != tuple(range(len(ctx.names))):
            raise MalformedMessage("a dealing for another roster")
        return public_key, directory, last

    def run(self, *, ids: list[int], length: int, word_bound: int, setup: dict[str, Any],
            seeds: dict[int, int], context: bytes = NO_CONTEXT,
            ) -> tuple[np.ndarray, list[int], int, int, int]:
        ctx = self.context
        self.why = {}
        firsts = {c: {**setup, **({"seed": seeds[c]} if seeds else {})} for c in ids}
        if self.public_key is None:
            hello = ctx.exchange(HELLO, {c: first_message(firsts[c], b"") for c in ids})
            firsts = {}
            held: dict[bytes, list[int]] = {}
            dealings, lasts = {}, {}
            for c in sorted(hello):
                try:
                    public_key, directory, lasts[c] = self._dealing(hello[c])
                except (MalformedMessage, PeerRejected, ValueError):
                    self.why[c] = "its dealing does not verify"
                    continue
                dealings[public_key.key_id] = (public_key, directory)
                held.setdefault(public_key.key_id, []).append(c)
            if not held:
                raise ProtocolAbort("no site holds a dealing that verifies for this plan")
            key_id = max(held, key=lambda k: (len(held[k]), -held[k][0]))
            self.public_key, self.directory = dealings[key_id]
            reported = sorted((lasts[c] for c in held[key_id]), reverse=True)
            floor = reported[min(self.threshold, len(reported)) - 1]
            LAST_USED[key_id] = max(LAST_USED.get(key_id, 0), floor)
            for other, holders in held.items():
                for c in holders if other != key_id else ():
                    self.why[c] = "it holds another dealing"
        key_id = self.public_key.key_id
        self._sequence = LAST_USED[key_id] = LAST_USED.get(key_id, 0) + 1
        spec = round_spec(sequence=self._sequence, length=length, clients=len(ids), word_bound=word_bound,
                          tagged=False, context=context)
        roster = {c: raw_identity(ctx.peers[n].identity_key) for c, n in enumerate(ctx.names)
                  if n in ctx.peers}
        server = PaillierServer(self.public_key, spec, expected=ids, threshold=self.threshold,
                                identities=roster)
        spec_bytes = spec.to_bytes()
        submissions = ctx.exchange(SUBMIT, {c: first_message(firsts[c], spec_bytes) if firsts else spec_bytes
                                            for c in ids})
        upload = 0
        for c in sorted(submissions):
            upload += len(submissions[c])
            try:
                server.receive(c, submissions[c])
            except MalformedMessage:
                self.why.setdefault(c, "its submission was refused")
        coordinator = ThresholdCoordinator(server, directory=self.directory, roster=roster)
        listing = coordinator.contributor_list()
        endorsements = ctx.exchange(ENDORSE, {c: listing for c in ids})
        for c in sorted(endorsements):
            upload += len(endorsements[c])
            try:
                coordinator.add_endorsement(c, endorsements[c])
            except MalformedMessage:
                self.why.setdefault(c, "its endorsement does not verify")
        request = coordinator.request()
        responses = ctx.exchange(DECRYPT, {c: request for c in server.participants})
        upload += sum(len(r) for r in responses.values())
        words = coordinator.combine(responses)
        for c, reason in coordinator.liars.items():
            self.why.setdefault(c, f"its decryption shares were refused: {reason}")
        aborts = (len(ids) - len(submissions)) + (len(ids) - len(endorsements)) + (
            len(server.participants) - len(responses))
        return words, list(server.participants), upload, aborts, len(server.rejected)


class ThresholdSite:
    """A site's side of threshold custody: its share, its durable endorsements, its client. Stages
    hello (only a coordinator's first aggregation), submit, endorse, decrypt: each at most once per
    setup, in order (the framework's rule in :meth:`SiteLayer.handle`)."""

    STAGES = (HELLO, SUBMIT, ENDORSE, DECRYPT)

    def __init__(self, context: SiteContext, setup: dict[str, Any], encoding: SiteEncoding) -> None:
        if context.state is None or not (Path(context.state) / SHARE_FILE).is_file():
            raise ClientAbort(NO_SHARE)
        try:
            dealt = load_share(Path(context.state) / SHARE_FILE)
            dealer = dealer_identity(dealt.dealer_certificate, trust=context.trust,
                                     name=context.config.federation.keyholder_name)
        except (ValueError, PeerRejected):
            raise ClientAbort(NO_SHARE) from None
        if (dealt.name, dealt.client_id) != (context.name, context.client_id) or tuple(
                n for _, n, _ in dealt.roster) != tuple(context.names):
            raise ClientAbort(NO_SHARE)
        self.dealt, self.encoding = dealt, encoding
        key = (context.name, dealer + dealt.share.public_key.key_id)
        self.endorsements = PerCallEndorsements(Path(context.state) / "endorsements.db")
        held = SITE_CLIENTS.get(key)
        if held is None:
            client = PaillierClient(context.client_id, identity=context.identity, announcer_identity=dealer,
                                    share=dealt.share, roster={c: k for c, _, k in dealt.roster},
                                    endorsements=self.endorsements)
            client.receive_announcement(dealt.announcement)
            client.receive_verification_keys(dealt.verification_keys)
            held = SITE_CLIENTS[key] = SiteClient(client, welcomed=True)
        self.client = held.client

    def client_threshold(self) -> int:
        """The dealt key's decryption threshold (shares per decryption)."""
        return int(self.client.threshold)

    def handle(self, stage: str, message: bytes) -> bytes | None:
        if stage == HELLO:
            last = self.endorsements.last_sequence(self.dealt.share.public_key.key_id)
            return envelope.encode({"announcement": self.dealt.announcement.hex(),
                                    "keys": self.dealt.verification_keys.hex(),
                                    "dealer": self.dealt.dealer_certificate.decode(), "last_sequence": last})
        if stage == SUBMIT:
            try:
                spec = RoundSpec.from_bytes(message)
            except (MalformedMessage, ValueError):
                raise ClientAbort(BAD_SETUP) from None
            return self.client.submit(message, self.encoding.words(spec), context=self.encoding.context)
        if stage == ENDORSE:
            return self.client.endorse(message)
        if stage == DECRYPT:
            return self.client.decryption_share(message)
        raise ClientAbort(BAD_SETUP)
