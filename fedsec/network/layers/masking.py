"""Pairwise-mask secure aggregation (SecAgg / SecAgg+) between a coordinator and its sites.

The coordinator runs :class:`~fedsec.protocols.masked.MaskedServer` and each site one
:class:`~fedsec.protocols.masked.MaskedClient`, unchanged: the framework carries their canonical
bytes. What the deployment adds:

- identities: the directory of Ed25519 identity keys comes from the sites' certificates. The
  coordinator relays the ring's certificates in the setup; every site verifies each one against
  the study's root, the role ``site``, the revocation list and the roster name of its client id,
  and refuses (``ClientAbort``) a ring where its own entry does not carry its own key. A field a
  peer sends never names a key.
- the encoder's clip and bits are pinned by the site from its own copy of the plan (updates) or
  to the statistics clip, never taken from the coordinator's parameters; the corrupt fraction and
  the population (the roster's size) too.
- randomness: the coordinator draws, from the run generator and in the simulation's order, one
  stochastic-rounding seed per site and (``dp.reproducible``) the ring's order, so a reproducible
  plan gives the simulation's sums. Only under ``dp.reproducible`` does a site use the seed it is
  sent; otherwise it rounds with its own OS-seeded generator and the ring is shuffled by the OS
  CSPRNG.
- client-level DP (``dp.mode = "client"``): a site adds a Skellam share of variance
  mu / (t - c) to its update's words, t being the session's threshold its own client checks and
  enforces and c the corrupt count of the ring under its own corrupt fraction and roster
  (:mod:`fedsec.network.client_noise`); the coordinator widens the words and subtracts the shifts.
- the corrupt fraction a site assumes is the larger of the plan's ``secure.corrupt`` and its
  policy's ``aggregation.min_corrupt`` (:func:`~fedsec.network.client_noise.site_corrupt`), for
  its threshold floor and quorum as for its noise share.
- the noise context (review S6-1): the session id a site runs under is
  :func:`bound_session` of the coordinator's nonce and the site's OWN
  :func:`~fedsec.network.client_noise.noise_context` (its plan's digest, z, D2, S): sites handed
  different z or plans are in different sessions, so their shares never meet in one sum (their
  headers, signatures and masks disagree: the site aborts, typed). t and c need not enter it: the
  session parameters (threshold, ring) are signed by every honest client.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization

from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import AggregateResult, ClientUpdate, Purpose
from fedsec.network.client_noise import (
    NO_CONTEXT,
    ClientNoise,
    noise_context,
    share_stream,
    site_colluders,
    site_corrupt,
    site_population,
)
from fedsec.network.errors import PeerRejected
from fedsec.network.layers.base import (
    OUT_OF_ORDER,
    CoordinatorContext,
    CoordinatorLayer,
    SiteContext,
    SiteLayer,
    first_message,
    round_floor,
)
from fedsec.network.pki import verify_peer
from fedsec.protocols.encoding import STATISTICS_CLIP, encoder_for, remove_offsets
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.masked import ClientPolicy, MaskedAggregation, MaskedClient, MaskedServer, RingGraph
from fedsec.protocols.masked import client as client_reasons
from fedsec.protocols.masked.graph import shuffled_ring
from fedsec.protocols.masked.messages import (
    SESSION_BYTES,
    ConsistencyRequest,
    ForwardedShares,
    KeyList,
    SessionParams,
    UnmaskRequest,
    decode,
)
from fedsec.protocols.masked.workers import shared_pool
from fedsec.protocols.privacy.client_level import NoHonestMargin, SkellamShares
from fedsec.secagg.errors import SecAggError

BAD_SETUP = "the aggregation's setup is malformed"
BAD_CERTIFICATE = "a relayed certificate does not verify for its roster name"
NOT_OURS = "the ring's entry for this site does not carry its own identity key"
NO_NOISE = "client-level DP without a noise share this site checked"
NARROW_WORDS = "the session's words leave no room for this site's noise share"
NO_MARGIN = "the session's threshold leaves no honest noise share against the tolerated colluders"
PURPOSES = ("update", "statistics")


def bound_session(nonce: bytes, context: bytes) -> bytes:
    """The masked session id of one aggregation: the coordinator's fresh ``nonce`` (16 bytes)
    bound to the noise ``context`` digest of the party computing it
    (:func:`~fedsec.network.client_noise.noise_context`, or ``NO_CONTEXT``): SHA-256, first 16 bytes.
    Every header, signed key and derived mask of the session carries it (review S6-1)."""
    return hashlib.sha256(b"fedsec/masking/session/v1" + nonce + context).digest()[:SESSION_BYTES]


def identity_bytes(peer_key: Any) -> bytes:
    """The raw 32 bytes of an Ed25519 public key."""
    return peer_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class MaskingCoordinator(CoordinatorLayer):
    """The coordinator side: one :class:`MaskedServer` per aggregation, driven stage by stage."""

    name = "masking"
    bundles_first_job = True
    """The first stage (advertise keys) goes to every ring member, i.e. every site given."""

    def __init__(self, context: CoordinatorContext) -> None:
        super().__init__(context)
        s, config = context.config.secure, context.config
        self.reproducible = config.dp.reproducible
        # The simulation's protocol, used for its parameter rule (degree, threshold) only.
        self.rules = MaskedAggregation(max_weight=context.max_weight, rng=context.rng, clip=s.clip,
                                       bits=s.bits, graph=s.graph, threshold=s.threshold, active=s.active,
                                       reproducible=self.reproducible, tolerated_corrupt=s.corrupt,
                                       population=len(context.names), workers=s.workers)
        if s.workers > 1:  # spawn the unmask stage's worker processes now, not in the first round
            shared_pool(s.workers).warm()
        self.last_misbehaved: dict[int, str] = {}
        self.client_noise: tuple[ClientNoise, SecureRandom] | None = None
        """Client-level DP, set for one update by :class:`~fedsec.network.remote.RemoteRound`: the
        noise rule and the run's client-noise stream (the sites draw the shares; this side only
        widens the words, subtracts the shifts and, under ``dp.reproducible``, replays the
        simulation's draws to tell each site where its share starts in the seeded stream)."""
        self.protocol_bytes: dict[int, list[int]] = {}
        """``client -> [bytes it sent, bytes it was sent]``: the protocol's own messages (what the
        simulation's in-memory transport counts), without the framework's setup and envelopes."""

    def min_contributions(self, n: int) -> int:
        return self.rules.min_contributions(n)

    def tolerated_colluders(self, n: int) -> int:
        return self.rules.tolerated_colluders(n)

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: Purpose = "update") -> AggregateResult:
        return self.drive(self.open(round_index, updates, purpose=purpose))

    def open(self, round_index: int, updates: Sequence[ClientUpdate], *,
             purpose: Purpose = "update", rng: np.random.Generator | None = None) -> MaskedSession:
        """A new aggregation of the contributions of ``updates``' sites, drawing from the run
        generator (or ``rng``, a copy of it that is ahead) what :meth:`aggregate` draws (the sites'
        rounding seeds, then the ring's order), nothing exchanged yet: :meth:`drive` runs it, or
        another aggregation's exchanges carry its first stages (:class:`MaskedSession`)."""
        ctx, s = self.context, self.context.config.secure
        draws = ctx.rng if rng is None else rng
        ids = [int(u.client_id) for u in updates]
        self.last_dropped = {c: "the aggregation aborted" for c in ids}
        self.last_misbehaved = {}
        n = len(ids)
        degree, threshold = self.rules.parameters(n)
        length = int(updates[0].vector.size)
        noise = None
        if purpose == "update" and self.client_noise is not None:
            rule, stream = self.client_noise
            noise = rule.shares(threshold, self.rules.tolerated_colluders(n), stream)
        encoder = encoder_for(purpose, clients=n, length=length, max_weight=ctx.max_weight, clip=s.clip,
                              bits=s.bits, noise=noise)
        # every refusal (ProtocolAbort) comes before the generator's draws: an aggregation that
        # could not be opened ahead is opened again later with the same draws
        directory = self._directory(ids) if s.active else None
        seeds = {c: int(draws.integers(0, 2**63 - 1)) for c in ids}
        graph = RingGraph(shuffled_ring(ids, draws if self.reproducible else None), degree)
        nonce = os.urandom(SESSION_BYTES)
        session = bound_session(nonce, noise_context(ctx.config, self.client_noise[0])
                                if noise is not None else NO_CONTEXT)
        certificates = {str(c): ctx.certificates[ctx.names[c]].decode() for c in ids
                        if ctx.names[c] in ctx.certificates}
        population = self.rules.population_for(n)
        server = MaskedServer(session=session, round_index=round_index, graph=graph, threshold=threshold,
                              encoder=encoder, length=length, active=s.active, directory=directory,
                              corrupt=s.corrupt, population=population, workers=s.workers)
        setup = {"layer": self.name, "purpose": purpose, "round": round_index, "session": nonce.hex(),
                 "certificates": certificates}
        # the first stage's recipients, in the order of its messages (only read under seeded noise)
        order = list(server.outgoing()) if noise is not None and self.reproducible else []
        offsets = self._noise_offsets(order, noise, length)
        setups = {c: {**setup, **({"seed": seeds[c]} if self.reproducible else {}), **offsets.get(c, {})}
                  for c in ids}
        return MaskedSession(layer=self, round_index=round_index, purpose=purpose, ids=ids, server=server,
                             encoder=encoder, noise=noise, setups=setups, degree=degree, threshold=threshold,
                             session=session)

    def drive(self, session: MaskedSession) -> AggregateResult:
        """Run ``session``'s remaining stages over :attr:`CoordinatorContext.exchange`; its sum.

        Raises:
            ProtocolAbort: the aggregation cannot complete (now, or in a stage another
                aggregation's exchanges carried)."""
        while not session.done:
            stage, outgoing = session.outgoing()
            session.take(self.context.exchange(stage, outgoing))
        return session.result()

    def _noise_offsets(self, order: list[int], noise: SkellamShares | None,
                       length: int) -> dict[int, dict[str, int]]:
        """Under ``dp.reproducible`` client-level DP, each site's position in the seeded noise
        stream: the simulation's clients draw their shares one after another in the order of the
        server's first messages, so this side replays those draws (nothing else)."""
        if noise is None or not self.reproducible:
            return {}
        offsets = {}
        for c in order:
            offsets[c] = {"noise": int(noise.random.state_dict()["offset"])}
            noise.draw(length)
        return offsets

    def _directory(self, ids: list[int]) -> dict[int, bytes]:
        ctx = self.context
        missing = [ctx.names[c] for c in ids if ctx.names[c] not in ctx.peers]
        if missing:
            raise ProtocolAbort(f"no verified certificate on record for {', '.join(missing)}")
        return {c: identity_bytes(ctx.peers[ctx.names[c]].identity_key) for c in ids}


class MaskedSession:
    """One masked aggregation in flight at the coordinator (built by :meth:`MaskingCoordinator.open`).

    It is stepped by whoever carries its messages: :meth:`outgoing` gives the current stage's
    messages (the first stage's carry each site's setup), :meth:`take` the replies that came back
    (and ends the stage). :attr:`before_input` is True while its next stage does not depend on the
    sites' contributions (advertise keys, share keys): those stages may travel in the calls of
    another aggregation (the update's), see docs/deployment.md. A failure of the protocol in any
    stage is kept and raised by :meth:`result` (never into the aggregation that carried it).
    """

    PRE_INPUT = ("advertise keys", "share keys")

    def __init__(self, *, layer: MaskingCoordinator, round_index: int, purpose: str, ids: list[int],
                 server: MaskedServer, encoder: Any, noise: SkellamShares | None,
                 setups: dict[int, dict[str, Any]], degree: int, threshold: int, session: bytes) -> None:
        self.layer, self.round_index, self.purpose, self.ids = layer, round_index, purpose, ids
        self.session = session
        """The masked session id every message of this aggregation carries."""
        self.server, self.encoder, self.noise, self.setups = server, encoder, noise, setups
        self.degree, self.threshold = degree, threshold
        self.failure: str | None = None
        self.upload = 0
        self.answered: set[int] = set()
        self._first = True

    @property
    def done(self) -> bool:
        return self.failure is not None or self.server.done

    @property
    def stage(self) -> str:
        return self.server.stage

    @property
    def before_input(self) -> bool:
        return not self.done and self.server.stage in self.PRE_INPUT

    def outgoing(self) -> tuple[str, dict[int, bytes]]:
        """``(stage, {client: message})`` of the current stage."""
        stage = self.server.stage
        try:
            outgoing = self.server.outgoing()
        except (SecAggError, MalformedMessage) as error:
            self._fail(f"masked round failed: {type(error).__name__}")
            return stage, {}
        for c, m in outgoing.items():
            self.layer.protocol_bytes.setdefault(c, [0, 0])[1] += len(m)
        if self._first:
            outgoing = {c: first_message(self.setups[c], m) for c, m in outgoing.items()}
            self._first = False
        return stage, outgoing

    def take(self, replies: dict[int, bytes]) -> None:
        """The current stage's replies (a site absent from ``replies`` dropped out); ends the stage."""
        if self.done:
            return
        try:
            for c in sorted(replies):
                self.upload += len(replies[c])
                self.layer.protocol_bytes.setdefault(c, [0, 0])[0] += len(replies[c])
                self.answered.add(c)
                self.server.receive(c, replies[c])
            self.server.close()
        except (SecAggError, MalformedMessage) as error:
            self._fail(f"masked round failed: {type(error).__name__}")
        except ProtocolAbort as abort:
            self._fail(str(abort))
        finally:
            self.layer.last_misbehaved = self.server.misbehaved

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self.layer.last_misbehaved = self.server.misbehaved

    def result(self) -> AggregateResult:
        """The aggregation's sum; ProtocolAbort when it failed or has not completed."""
        layer, server, ids = self.layer, self.server, self.ids
        layer.last_misbehaved = server.misbehaved
        if self.failure is not None:
            raise ProtocolAbort(self.failure)
        try:
            total, survivors = server.result()
        except (SecAggError, MalformedMessage) as error:
            raise ProtocolAbort(f"masked round failed: {type(error).__name__}") from None
        layer.last_dropped = {c: server.rejected.get(c, "no answer before a stage deadline, or aborted")
                              for c in ids if c not in set(survivors)}
        words = remove_offsets(total, len(survivors), self.noise)
        weighted, total_weight, clipped = self.encoder.decode(words)
        in_sum = set(survivors)
        return AggregateResult(
            weighted_sum=weighted, total_weight=float(total_weight), participants=survivors,
            dropped=tuple(c for c in ids if c not in in_sum), upload_bytes=self.upload,
            metrics={"clipped": float(clipped), "rejected": float(len(server.rejected)),
                     "misbehaved": float(len(server.misbehaved)),
                     "client_aborts": float(len([c for c in ids if c not in self.answered])),
                     "secagg_degree": float(self.degree), "secagg_threshold": float(self.threshold)})


class MaskingSite(SiteLayer):
    """The site side: one :class:`MaskedClient` for its contribution, keys from the certificates.

    Its stages are the :class:`MaskedServer`'s, in order (the consistency check only when active);
    the framework answers each at most once and closes the layer after the unmask stage."""

    STAGES = ("advertise keys", "share keys", "masked input", "consistency check", "unmask")
    INPUT_STAGE = "masked input"
    """Keys, shares and commitments do not depend on the input: an evaluation's session may be set
    up before its sums exist, and an update's before its training (its keys agreed during the
    round before; not under client-level DP), and take the input at the masked-input stage."""
    CLIENT_STAGES = dict(zip(STAGES, ("AwaitParams", "AwaitKeyList", "AwaitShares", "AwaitConsistency",
                                      "AwaitUnmask"), strict=True))
    """The :class:`MaskedClient` state each stage's message is for: a message labelled with
    another stage than the one the client is at is refused (``OUT_OF_ORDER``), so the label the
    framework's order rule sees is the protocol's."""

    MESSAGES = dict(zip(STAGES, (SessionParams, KeyList, ForwardedShares, ConsistencyRequest, UnmaskRequest),
                        strict=True))
    """The server's message of each stage."""

    def __init__(self, context: SiteContext, *, setup: dict[str, Any], vector: np.ndarray | None,
                 weight: int, length: int | None = None) -> None:
        super().__init__(context, setup=setup, vector=vector, weight=weight, length=length)
        config, s = context.config, context.config.secure
        purpose, round_index = setup.get("purpose"), setup.get("round")
        session, certificates = setup.get("session"), setup.get("certificates")
        if (purpose not in PURPOSES or isinstance(round_index, bool) or not isinstance(round_index, int)
                or not isinstance(session, str) or not isinstance(certificates, dict)):
            raise ClientAbort(BAD_SETUP)
        try:
            session_id = bytes.fromhex(session)
        except ValueError:
            raise ClientAbort(BAD_SETUP) from None
        if len(session_id) != SESSION_BYTES:
            raise ClientAbort(BAD_SETUP)
        update = purpose == "update"
        client_level = update and config.dp.mode == "client"
        if vector is None and client_level:  # a client-level update is never given late
            raise ClientAbort(BAD_SETUP)
        if client_level and context.client_noise is None:
            raise ClientAbort(NO_NOISE)
        # the session this site takes part in binds its OWN noise context (review S6-1): a peer or
        # coordinator whose context differs is in another session (headers, signed keys and masks
        # all carry it), so this site never completes a sum with shares drawn for another mu
        session_id = bound_session(session_id, noise_context(config, context.client_noise)
                                   if client_level else NO_CONTEXT)
        self.session_id = session_id
        """The masked session id this site's client runs under."""
        directory = self._directory(certificates) if s.active else None
        seed = setup.get("seed")
        if config.dp.reproducible:
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
                raise ClientAbort(BAD_SETUP)
            rng = np.random.default_rng(seed)
        else:
            rng = np.random.default_rng()
        min_ring, min_threshold = round_floor(context)
        policy = ClientPolicy(require_active=s.active, corrupt=site_corrupt(config, context.policy),
                              population=site_population(roster=len(context.names), policy=context.policy),
                              clip=s.clip if update else STATISTICS_CLIP, bits=s.bits if update else None,
                              min_ring=min_ring, min_threshold=min_threshold)
        self.noise: tuple[ClientNoise, SecureRandom] | None = None
        self.shares: SkellamShares | None = None
        """Client-level DP: this site's noise share, once the session's threshold is known."""
        if client_level:
            offset = setup.get("noise", 0) if config.dp.reproducible else None
            if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
                raise ClientAbort(BAD_SETUP)
            self.noise = (context.client_noise, share_stream(config, offset))
        self.client = MaskedClient(client_id=context.client_id, session=session_id, round_index=round_index,
                                   update=vector, weight=weight, rng=rng, length=self.length,
                                   signing_key=context.identity if s.active else None, directory=directory,
                                   policy=policy, sessions=context.sessions,
                                   noise=self._draw if self.noise is not None else None)

    def _directory(self, certificates: dict[str, Any]) -> dict[int, bytes]:
        ctx, directory = self.context, {}
        for key, pem in certificates.items():
            if not key.isdigit() or int(key) >= len(ctx.names) or not isinstance(pem, str):
                raise ClientAbort(BAD_SETUP)
            client = int(key)
            try:
                peer = verify_peer(pem.encode(), trust=ctx.trust, roles=("site",), roster={ctx.names[client]})
            except (PeerRejected, ValueError):
                raise ClientAbort(BAD_CERTIFICATE) from None
            directory[client] = identity_bytes(peer.identity_key)
        if directory.get(ctx.client_id) != ctx.identity.public:
            raise ClientAbort(NOT_OURS)
        return directory

    def take_input(self, vector: np.ndarray, weight: int) -> None:
        self.client.provide(vector, weight)

    def check_stage(self, stage: str, message: bytes) -> None:
        """The label is the client's state, and the message is that stage's message of this
        session and round (the client checks it again): a message of another session (the other
        purpose's, an earlier round's) is refused before the contribution is taken."""
        if self.client.stage != self.CLIENT_STAGES[stage]:
            raise ClientAbort(OUT_OF_ORDER)
        try:
            header, _ = decode(message, expect=self.MESSAGES[stage])
        except MalformedMessage:
            raise ClientAbort(client_reasons.MALFORMED) from None
        if header.session != self.session_id or header.round != self.setup.get("round"):
            raise ClientAbort(client_reasons.REPLAY)

    def answer(self, stage: str, message: bytes) -> bytes | None:
        if self.noise is not None and self.shares is None:
            self._share_for(message)
        return self.client.handle(message)

    def _share_for(self, message: bytes) -> None:
        """The share for the session's threshold t (which this site's client checks against its
        floor before it draws, and enforces at unmasking) and the ring's corrupt count c under this
        site's own corrupt fraction and roster: variance mu / (t - c); t - c < 1 is refused
        (``NO_MARGIN``). A message that is not the session's parameters is left to the client,
        which refuses it."""
        try:
            _, params = decode(message, expect=SessionParams)
        except MalformedMessage:
            return
        if params.threshold < 1 or len(params.ring) < 2:  # refused by the client before it draws
            return
        assert self.noise is not None
        rule, stream = self.noise
        ctx = self.context
        colluders = site_colluders(ctx.config, roster=len(ctx.names), policy=ctx.policy,
                                   ring=len(params.ring))
        try:
            self.shares = rule.shares(params.threshold, colluders, stream)
        except NoHonestMargin:
            raise ClientAbort(NO_MARGIN) from None
        if params.word_slack < self.shares.slack:
            raise ClientAbort(NARROW_WORDS)

    def _draw(self, length: int) -> np.ndarray:
        if self.shares is None:
            raise ClientAbort(NO_NOISE)
        return self.shares.draw(length)
