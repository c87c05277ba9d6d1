"""Packed Paillier summation between a coordinator and its sites, in both custodies.

The coordinator runs :class:`~fedsec.protocols.paillier.PaillierServer` and each site one
:class:`~fedsec.protocols.paillier.PaillierClient`, unchanged; the framework carries their
canonical bytes. ``secure.custody`` picks who decrypts:

- ``key_holder`` (this module): the separate ``fedsec keyholder`` process at
  ``federation.keyholder`` (certificate name ``federation.keyholder_name``). The coordinator is
  the only party that talks to it (:class:`~fedsec.network.keyholder_client.KeyHolderClient`): it
  enrols each site by relaying the site's certificate, relays each site's signed registration and
  the welcome sealed for it, and asks for the decryption of the product, signing the request with
  its certificate's identity key. Stages per aggregation: ``paillier/register`` (setup: the key
  holder's signed announcement and certificate; the site answers its registration, or nothing if
  the key holder already welcomed it) and ``paillier/submit`` (the welcome if any, and the round
  spec; the site answers its signed submission).
- ``threshold`` (:mod:`fedsec.network.layers.paillier_threshold`): the sites hold key shares
  dealt by the auditor's ceremony (``fedsec deal``).

What a site checks itself (never taken from the coordinator): the announcer's certificate
(the study's root, role ``keyholder``, name ``federation.keyholder_name`` of its own copy of the
plan) and so the announcer's identity key; the encoder's clip and bits (its plan, or the
statistics clip); that the spec's word bound and length are the ones its own encoder gives for the
announced number of contributions and weight bound; under client-level DP that the spec's
noise context is its own (:func:`~fedsec.network.client_noise.noise_context` of its plan, z, t
and c: review S6-1); under key-holder custody that the spec's
roster digest is its own plan's ``federation.sites`` (its tags bind it, and the key holder counts
only contributors enrolled under a name of that roster: review S5-1); the sequence number only
moves forward (:class:`PaillierClient`). Under ``dp.reproducible`` a site rounds with the seed it
is sent, drawn by the coordinator from the run generator in the simulation's order; otherwise
with its own OS-seeded generator.

A site keeps its :class:`PaillierClient` for the life of its process (:data:`SITE_CLIENTS`, one per
site name and announcer): the key holder's welcome, the last sequence number submitted and, under
threshold custody, the party's endorsement record (durable in its state directory) persist across
aggregations. A restarted site registers again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedsec.dp import SecureRandom
from fedsec.fl_core import clients_per_round
from fedsec.fl_core.aggregation import AggregateResult, ClientUpdate, Purpose
from fedsec.network.client_noise import ClientNoise, noise_context, share_stream, site_colluders
from fedsec.network.errors import MalformedFrame, PeerRejected
from fedsec.network.keyholder import raw_identity
from fedsec.network.layers.base import (
    CoordinatorContext,
    CoordinatorLayer,
    SiteContext,
    SiteLayer,
    first_message,
    round_floor,
)
from fedsec.network.party_audit import identity_fingerprint, message
from fedsec.network.pki import verify_peer
from fedsec.network.transport import TransportError
from fedsec.protocols.encoding import encoder_for, remove_offsets
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.masked.policy import population_corrupt
from fedsec.protocols.paillier import PaillierClient, PaillierServer, RoundSpec, default_threshold
from fedsec.protocols.paillier.messages import KEY_HOLDER, Announcement, decode
from fedsec.protocols.paillier.spec import NO_CONTEXT, NO_ROSTER, roster_digest
from fedsec.protocols.privacy.client_level import NoHonestMargin, SkellamShares
from fedsec.protocols.wire import Reader, Writer
from fedsec.secagg.errors import SecAggError
from fedsec.secagg.paillier import PaillierPublicKey, slot_bits_for

REGISTER, SUBMIT = "paillier/register", "paillier/submit"
BAD_SETUP = "the aggregation's setup is malformed"
BAD_ANNOUNCER = "the announcer's certificate does not verify for the plan's key holder"
LOW_THRESHOLD = "the key's decryption threshold is below this site's policy or plan"
BAD_SPEC = "the round spec does not match this site's own encoder"
NO_NOISE = "client-level DP without a noise share this site checked"
NO_MARGIN = "the key's decryption threshold leaves no honest noise share against the tolerated colluders"
PURPOSES = ("update", "statistics")


class KeyHolderUnusable(RuntimeError):
    """The key holder cannot serve this plan (unreachable, another threshold, a bad announcement):
    not a round's abort, the run stops with this message."""


@dataclass
class SiteClient:
    """What a site remembers between aggregations: its client, and whether it was welcomed."""

    client: PaillierClient
    welcomed: bool = False


SITE_CLIENTS: dict[tuple[str, bytes], SiteClient] = {}
"""site name, announcer identity key -> its :class:`SiteClient` (this process's memory)."""


def plan_threshold(context_config: Any, population: int) -> int:
    """The plan's Paillier threshold: ``secure.threshold``, or the simulation's default rule."""
    s, t = context_config.secure, context_config.train
    return s.threshold or default_threshold(clients_per_round(t.fraction, population))


def round_spec(*, sequence: int, length: int, clients: int, word_bound: int, tagged: bool,
               roster: bytes = NO_ROSTER, context: bytes = NO_CONTEXT) -> RoundSpec:
    """The spec of one aggregation of ``clients`` vectors of ``length`` values (as the simulation),
    bound to the roster digest ``roster`` (key-holder custody: the plan's :func:`roster_digest`)
    and the noise context ``context`` (client-level DP: :func:`noise_context`, review S6-1)."""
    return RoundSpec(sequence=sequence, length=length + 3, slot_bits=slot_bits_for(word_bound, clients),
                     word_bound=word_bound, max_contributions=clients, tagged=tagged, roster=roster,
                     context=context)


def announcer_identity(context: SiteContext, certificate: Any) -> bytes:
    """The identity key of the plan's key holder (or dealer) from its relayed certificate."""
    if not isinstance(certificate, str):
        raise ClientAbort(BAD_SETUP)
    try:
        peer = verify_peer(certificate.encode(), trust=context.trust, roles=("keyholder",),
                           roster={context.config.federation.keyholder_name})
    except (PeerRejected, ValueError):
        raise ClientAbort(BAD_ANNOUNCER) from None
    return raw_identity(peer.identity_key)


def int_field(setup: dict[str, Any], key: str, low: int, high: int) -> int:
    value = setup.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ClientAbort(BAD_SETUP)
    return value


def hex_field(setup: dict[str, Any], key: str) -> bytes:
    value = setup.get(key)
    try:
        return bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raise ClientAbort(BAD_SETUP) from None


class SiteEncoding:
    """A site's encoding of its contribution for one aggregation, from its own plan and the setup.

    The coordinator announces the number of contributions n and the weight bound; clip and bits
    are the site's (its plan for updates, the statistics clip for statistics)."""

    def __init__(self, context: SiteContext, setup: dict[str, Any], vector: np.ndarray, weight: int) -> None:
        s = context.config.secure
        self.purpose = setup.get("purpose")
        if self.purpose not in PURPOSES:
            raise ClientAbort(BAD_SETUP)
        self.clients = int_field(setup, "clients", 1, len(context.names))
        self.max_weight = max_weight = int_field(setup, "max_weight", 1, 1 << 40)
        if not 1 <= weight <= max_weight:
            raise ClientAbort(BAD_SETUP)
        self.noise: SkellamShares | None = None
        self.context = NO_CONTEXT
        """The digest of this site's own noise context (:func:`noise_context`) once it adds a
        share; a spec bound to another is refused (OTHER_CONTEXT)."""
        self.encoder = self._encoder(s.clip, s.bits, int(vector.size))
        if context.config.dp.reproducible:
            self.rng = np.random.default_rng(int_field(setup, "seed", 0, 2**63 - 1))
        else:
            self.rng = np.random.default_rng()
        self.vector, self.weight = vector, weight

    def _encoder(self, clip: float, bits: int, length: int) -> Any:
        try:
            return encoder_for(self.purpose, clients=self.clients, length=length, max_weight=self.max_weight,
                               clip=clip, bits=bits, noise=self.noise)
        except (ProtocolAbort, SecAggError, ValueError):
            raise ClientAbort(BAD_SETUP) from None

    def add_noise(self, context: SiteContext, noise: SkellamShares, noise_digest: bytes) -> None:
        """Client-level DP: add ``noise`` (this site's share, drawn for the context whose digest is
        ``noise_digest``) to the update's words; the encoder's words widen by its room, as the
        coordinator's do."""
        self.noise, self.context = noise, noise_digest
        s = context.config.secure
        self.encoder = self._encoder(s.clip, s.bits, int(self.vector.size))

    def words(self, spec: RoundSpec) -> np.ndarray:
        """The encoded words (with this site's noise share under client-level DP), after checking
        the spec is the one this encoder implies."""
        if (spec.word_bound != self.encoder.word_bound or spec.length != self.vector.size + 3
                or spec.max_contributions != self.clients):
            raise ClientAbort(BAD_SPEC)
        words = self.encoder.encode(self.vector.astype(np.float64), self.weight, rng=self.rng).words
        if self.noise is not None:
            words[:-2] += self.noise.draw(int(self.vector.size)).astype(words.dtype)
        return words


class PaillierCoordinator(CoordinatorLayer):
    """The coordinator side; dispatches on ``secure.custody``."""

    name = "paillier"

    def __init__(self, context: CoordinatorContext) -> None:
        super().__init__(context)
        self.threshold = plan_threshold(context.config, len(context.names))
        if context.config.secure.custody == "key_holder":
            self.custody: _Custody = KeyHolderCustody(context, self.threshold)
        else:
            from fedsec.network.layers.paillier_threshold import ThresholdCustody

            self.custody = ThresholdCustody(context, self.threshold)
        self.client_noise: tuple[ClientNoise, SecureRandom] | None = None
        """Client-level DP, set for one update by :class:`~fedsec.network.remote.RemoteRound` (see
        :class:`~fedsec.network.layers.masking.MaskingCoordinator`): the sites draw shares of
        variance mu / (t - c) for the key's decryption threshold t and c = :attr:`colluders`."""
        self.colluders = population_corrupt(len(context.names), context.config.secure.corrupt)
        """c = floor(``secure.corrupt`` x roster size): the sites that may collude with the
        coordinator, for whom the client-level shares are provisioned (the simulation's
        ``PaillierAggregation.tolerated_colluders``; a site computes the same from its own plan)."""

    def tolerated_colluders(self, n: int) -> int:
        return self.colluders

    def min_contributions(self, n: int) -> int:
        return self.threshold

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        ctx, s = self.context, self.context.config.secure
        ids = [int(u.client_id) for u in updates]
        if len(ids) < self.threshold:
            self.last_dropped = {c: "aborted" for c in ids}
            raise ProtocolAbort(f"{len(ids)} valid clients; only sums of >= {self.threshold} are decrypted")
        length = int(updates[0].vector.size)
        noise, digest = None, NO_CONTEXT
        if purpose == "update" and self.client_noise is not None:
            rule, stream = self.client_noise
            try:
                noise = rule.shares(self.threshold, self.colluders, stream)
            except ProtocolAbort:
                self.last_dropped = {c: "aborted" for c in ids}
                raise
            digest = noise_context(ctx.config, rule, threshold=self.threshold, colluders=self.colluders)
        encoder = encoder_for(purpose, clients=len(ids), length=length, max_weight=ctx.max_weight,
                              clip=s.clip, bits=s.bits, noise=noise)
        seeds = {c: int(ctx.rng.integers(0, 2**63 - 1)) for c in ids}
        setup = {"layer": self.name, "custody": s.custody, "purpose": purpose, "round": round_index,
                 "clients": len(ids), "max_weight": ctx.max_weight}
        if noise is not None and ctx.config.dp.reproducible:
            # the simulation's clients draw their shares one after another in this order: replay
            # those draws to tell each site where its share starts in the seeded stream
            offsets = {}
            for c in ids:
                offsets[str(c)] = int(noise.random.state_dict()["offset"])
                noise.draw(length)
            setup["noise"] = offsets
        try:
            words, participants, upload, aborts, rejected = self.custody.run(
                ids=ids, length=length, word_bound=encoder.word_bound, setup=setup,
                seeds=seeds if ctx.config.dp.reproducible else {}, context=digest)
        except ProtocolAbort:
            self.last_dropped = {c: "aborted" for c in ids}
            raise
        weighted, total_weight, clipped = encoder.decode(remove_offsets(words[:-1], int(words[-1]), noise))
        in_sum = set(participants)
        self.last_dropped = {c: self.custody.why.get(c, "no answer before a stage deadline, or aborted")
                             for c in ids if c not in in_sum}
        return AggregateResult(
            weighted_sum=weighted, total_weight=float(total_weight), participants=tuple(participants),
            dropped=tuple(c for c in ids if c not in in_sum), upload_bytes=upload,
            metrics={"clipped": float(clipped), "rejected": float(rejected), "client_aborts": float(aborts),
                     "contributions": float(words[-1])})


class _Custody(ABC):
    """One custody's rounds (key holder or threshold): ``run`` returns (summed words, participants,
    upload bytes, site aborts, rejected submissions) or raises ProtocolAbort; ``why`` says why a
    site is not in it."""

    why: dict[int, str]

    @abstractmethod
    def run(self, *, ids: list[int], length: int, word_bound: int, setup: dict[str, Any],
            seeds: dict[int, int], context: bytes = NO_CONTEXT,
            ) -> tuple[np.ndarray, list[int], int, int, int]:
        """Run one aggregation of ``ids`` in this custody, its spec bound to the noise ``context``."""


class KeyHolderCustody(_Custody):
    """Key-holder custody over the network (see the module)."""

    def __init__(self, context: CoordinatorContext, threshold: int) -> None:
        f = context.config.federation
        if not f.keyholder:
            raise KeyHolderUnusable("federation.keyholder: names no key holder")
        if context.identity is None or context.trust is None or context.cert_path is None:
            raise KeyHolderUnusable("the coordinator's identity key and certificate are needed to ask the "
                                    "key holder")
        self.context, self.threshold = context, threshold
        self.why: dict[int, str] = {}
        self._client = None
        self._enrolled: set[int] = set()
        self._announcement = b""
        self._certificate = ""
        self._public_key: PaillierPublicKey | None = None
        self._sequence = 0
        self._registered_once: set[int] = set()

    def _keyholder(self):
        """Connect on first use: status, announcement, threshold check."""
        if self._client is not None:
            return self._client
        from fedsec.network.keyholder_client import KeyHolderClient

        ctx, f = self.context, self.context.config.federation
        client = KeyHolderClient(address=f.keyholder, trust=ctx.trust, cert_path=ctx.cert_path,
                                 key_path=ctx.key_path, name=f.keyholder_name,
                                 deadline=max(60.0, 4 * f.stage_timeout), record=self._record)
        try:
            status = client.status()
            announcement = client.announcement()
            message = decode(announcement, Announcement)
        except (TransportError, PeerRejected, MalformedFrame, MalformedMessage, ValueError) as error:
            client.close()
            raise KeyHolderUnusable(f"federation.keyholder: {f.keyholder} did not serve ({error})") from None
        if message.custody != KEY_HOLDER or message.threshold != self.threshold or \
                status.get("threshold") != self.threshold:
            client.close()
            raise KeyHolderUnusable(f"federation.keyholder: its threshold is {message.threshold}; the plan's "
                                    f"is {self.threshold} (secure.threshold)")
        self._public_key = PaillierPublicKey.from_bytes(message.public_key)
        self._announcement, self._certificate = announcement, str(status["certificate"])
        self._client = client
        return client

    def _record(self, topic: str, request: bytes, reply: bytes | None) -> None:
        """The coordinator's audit of a key-holder call (the key holder logs the same pair)."""
        audit, name = self.context.audit, self.context.config.federation.keyholder_name
        if audit is None:
            return
        if reply is None:
            audit.event("send", details=message("to", name, topic, request))
        else:
            audit.sent_then_received(name, topic, request, reply)

    def _enrol(self, ids: list[int]) -> list[int]:
        """Enrol the sites not yet enrolled; returns the ids enrolled now or before."""
        ctx, client, ready = self.context, self._client, []
        for c in ids:
            if c not in self._enrolled:
                pem = ctx.certificates.get(ctx.names[c])
                if pem is None:
                    self.why[c] = "no certificate on record"
                    continue
                try:
                    client.enrol(c, pem)
                except TransportError:
                    self.why[c] = "the key holder refused its enrolment"
                    continue
                self._enrolled.add(c)
            ready.append(c)
        return ready

    def run(self, *, ids: list[int], length: int, word_bound: int, setup: dict[str, Any],
            seeds: dict[int, int], context: bytes = NO_CONTEXT,
            ) -> tuple[np.ndarray, list[int], int, int, int]:
        ctx = self.context
        client = self._keyholder()
        self.why = {}
        # The key holder's own count, asked afresh: another instance of this layer (the
        # evaluation's), or an earlier run, may have used numbers since.
        try:
            self._sequence = int(client.status()["last_sequence"]) + 1
        except (TransportError, MalformedFrame, ValueError, KeyError) as error:
            raise ProtocolAbort(f"the key holder did not answer ({getattr(error, 'code', 'malformed')})") \
                from None
        spec = round_spec(sequence=self._sequence, length=length, clients=len(ids), word_bound=word_bound,
                          tagged=True, roster=roster_digest(ctx.names), context=context)
        server = PaillierServer(self._public_key, spec, expected=ids, threshold=self.threshold,
                                identities={c: raw_identity(ctx.peers[ctx.names[c]].identity_key) for c in ids
                                            if ctx.names[c] in ctx.peers},
                                identity=ctx.identity, roster=ctx.names)
        ready = self._enrol(ids)
        setup = {**setup, "announcement": self._announcement.hex(), "announcer": self._certificate}
        outgoing = {c: first_message({**setup, **({"seed": seeds[c]} if seeds else {})}, b"") for c in ready}
        upload, welcomes = 0, {}
        for c, registration in sorted(ctx.exchange(REGISTER, outgoing).items()):
            if not registration:
                welcomes[c] = b""
                continue
            upload += len(registration)
            try:
                welcomes[c] = client.register(registration)
            except TransportError:
                self.why[c] = "the key holder refused its registration"
        submissions = ctx.exchange(SUBMIT, {c: Writer().blob(w).blob(spec.to_bytes()).getvalue()
                                            for c, w in welcomes.items()})
        for c in sorted(submissions):
            upload += len(submissions[c])
            try:
                server.receive(c, submissions[c])
            except MalformedMessage:
                self.why[c] = "its submission was refused"
        aborts = len(ready) - len(submissions)
        try:
            request = server.decryption_request()
        except ProtocolAbort:
            self._decrypt(server.void_request())  # burn the number: the next aggregation's is next
            raise
        answer = self._decrypt(request)
        self._acknowledge(setup.get("round"))
        words = server.finish(answer)
        return words, list(server.participants), upload, aborts, len(server.rejected)

    def _acknowledge(self, round_index: int | None) -> None:
        """Record the key holder's log head in the coordinator's log (its tail cannot be dropped
        unnoticed) if it names the key holder's certificate and identity key, row >= 1 and not below
        an earlier ack (else ``misbehaved`` at stage ``ack``); a failed status call only skips it."""
        if self.context.audit is None:
            return
        try:
            head = self._client.status().get("head")
        except (TransportError, MalformedFrame, ValueError):
            return
        server = self._client.transport.server
        if server is None:
            return
        problem = self.context.audit.ack_checked(head, actor=server.name, round=round_index,
                                                 fingerprint=identity_fingerprint(server.identity_key))
        if problem is not None:
            self.context.audit.event("misbehaved", round=round_index, stage="ack",
                                     details={"site": server.name, "reason": problem})

    def _decrypt(self, request: bytes) -> bytes:
        try:
            return self._client.decrypt(request)
        except (TransportError, MalformedFrame) as error:
            raise ProtocolAbort(f"the key holder did not answer ({getattr(error, 'code', 'malformed')})") \
                from None


class PaillierSite(SiteLayer):
    """The site side; dispatches on the custody of the site's own plan."""

    def __init__(self, context: SiteContext, *, setup: dict[str, Any], vector: np.ndarray,
                 weight: int) -> None:
        super().__init__(context, setup=setup, vector=vector, weight=weight)
        custody = context.config.secure.custody
        if setup.get("custody") != custody or setup.get("layer") != "paillier":
            raise ClientAbort(BAD_SETUP)
        int_field(setup, "round", 0, 2**62)
        self.encoding = SiteEncoding(context, setup, vector, weight)
        if custody == "key_holder":
            self.impl: SiteLayer = KeyHolderSite(context, setup, self.encoding)
        else:
            from fedsec.network.layers.paillier_threshold import ThresholdSite

            self.impl = ThresholdSite(context, setup, self.encoding)
        self.STAGES = self.impl.STAGES
        # only sums of >= the key's threshold of submissions are decrypted: that threshold, signed
        # in the announcement, must meet the site's policy and the plan (min_threshold)
        threshold = self.impl.client_threshold()
        if threshold < round_floor(context)[1]:
            raise ClientAbort(LOW_THRESHOLD)
        if self.encoding.purpose == "update" and context.config.dp.mode == "client":
            # client level: a share of variance mu / (t - c) for that threshold t and the c sites
            # this site's own corrupt fraction tolerates of its roster, so every decrypted sum
            # (>= t submissions, <= c of them colluders') carries at least mu of honest noise
            if context.client_noise is None:
                raise ClientAbort(NO_NOISE)
            offset = None
            if context.config.dp.reproducible:
                offsets = setup.get("noise")
                offset = offsets.get(str(context.client_id)) if isinstance(offsets, dict) else None
                if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                    raise ClientAbort(BAD_SETUP)
            colluders = site_colluders(context.config, roster=len(context.names), policy=context.policy)
            try:
                shares = context.client_noise.shares(threshold, colluders,
                                                     share_stream(context.config, offset))
            except NoHonestMargin:
                raise ClientAbort(NO_MARGIN) from None
            self.encoding.add_noise(context, shares, noise_context(
                context.config, context.client_noise, threshold=threshold, colluders=colluders))

    def answer(self, stage: str, message: bytes) -> bytes | None:
        return self.impl.handle(stage, message)


class KeyHolderSite:
    """Key-holder custody at a site: register once per announcement, then submit (once: the
    framework's rule in :meth:`SiteLayer.handle` closes the layer after the submission)."""

    STAGES = (REGISTER, SUBMIT)

    def __init__(self, context: SiteContext, setup: dict[str, Any], encoding: SiteEncoding) -> None:
        announcer = announcer_identity(context, setup.get("announcer"))
        announcement = hex_field(setup, "announcement")
        key = (context.name, announcer)
        held = SITE_CLIENTS.get(key)
        if held is None:
            held = SiteClient(PaillierClient(context.client_id, identity=context.identity,
                                             announcer_identity=announcer))
        registration = held.client.receive_announcement(announcement)
        if registration is None:
            raise ClientAbort(BAD_SETUP)
        SITE_CLIENTS[key] = held
        self.held, self.registration, self.encoding = held, registration, encoding
        self.roster = tuple(context.names)

    def client_threshold(self) -> int:
        """The decryption threshold of the announced key (submissions per decrypted sum)."""
        return int(self.held.client.threshold)

    def handle(self, stage: str, message: bytes) -> bytes | None:
        if stage == REGISTER:
            return b"" if self.held.welcomed else self.registration
        if stage == SUBMIT:
            try:
                reader = Reader(message)
                welcome, spec_bytes = bytes(reader.view()), bytes(reader.view())
                reader.end()
                spec = RoundSpec.from_bytes(spec_bytes)
            except (ValueError, MalformedMessage):
                raise ClientAbort(BAD_SETUP) from None
            if welcome:
                self.held.client.receive_welcome(welcome)
                self.held.welcomed = True
            # the spec must bind this site's own plan's roster (PaillierClient refuses another):
            # the key holder then counts only sites of that roster towards its threshold
            # and the site's own noise context (review S6-1): every share of the sum drawn alike
            return self.held.client.submit(spec_bytes, self.encoding.words(spec), roster=self.roster,
                                           context=self.encoding.context)
        raise ClientAbort(BAD_SETUP)
