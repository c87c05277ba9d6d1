"""The client of the pairwise-mask protocol: one small state class per stage.

Stages (Bonawitz et al. 2017, Bell et al. 2020 for the sparse graph):
  params -> AdvertiseKeys -> (key list) ShareKeys -> (forwarded shares) MaskedInput
  -> [active mode: (survivor list) ConsistencySignature] -> (unmask request) UnmaskResponse.

Every abort rule is an explicit check that raises :class:`ClientAbort` with a reason code; after
an abort the client answers nothing again. An honest client never reveals both the self-mask
seed and the mask key of one neighbour, never reveals its own, and never unmasks for a session
or round other than the one it was started for.

Active (authenticated, the default) mode adds the rules of docs/secure-aggregation.md: every key
entry it uses carries its owner's long-term signature; it signs at most one survivor list S per
round; it reveals anything only after seeing signatures on that same S from a quorum
q > (n + c) / 2 of the ring; it reveals a share of v's seed only if v is in S and v's signed
partner attestation shows at least t partners in S, and a share of w's mask key only if w is
not in S. It refuses any threshold below the floor of :mod:`protocols.masked.policy`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from fedsec.protocols.errors import ClientAbort, MalformedMessage
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.graph import RingGraph
from fedsec.protocols.masked.keys import (
    attestation_message,
    commitment_digest,
    consistency_message,
    key_message,
    mask_key,
    self_mask_key,
    share_box_context,
    share_box_key,
    share_hash,
)
from fedsec.protocols.masked.policy import minimum_threshold, survivor_quorum
from fedsec.protocols.masked.sessions import PROCESS_SESSIONS, SessionRecord
from fedsec.secagg import keys as crypto
from fedsec.secagg import shamir
from fedsec.secagg.encoding import Encoded, FixedPointEncoder
from fedsec.secagg.errors import CryptoError, SecAggError
from fedsec.secagg.prg import MaskExpander

# Abort reasons (stable strings; tests and audit logs match on them).
MALFORMED = "malformed message"
REPLAY = "message from another session or round"
UNSAFE_PARAMS = "unsafe or invalid session parameters"
OWN_KEY = "own key missing, altered or duplicated in the key list"
DUPLICATE_KEYS = "duplicate clients or keys in the key list"
BAD_SIGNATURE = "a signature does not verify"
BAD_KEY = "a public key is malformed or of small order"
FEW_NEIGHBOURS = "fewer than t neighbours"
SHARE_AUTH = "a share ciphertext fails authentication"
UNKNOWN_CLIENT = "a client that was never in the round"
BOTH_LISTS = "a client listed as both alive and dropped"
SELF_DROPPED = "itself listed as dropped"
FEW_SURVIVORS = "too few survivors"
INCONSISTENT = "survivor lists disagree"
ATTESTATION = "a survivor's partner attestation is missing, invalid or names fewer than t survivors"
ABORTED = "client has aborted"
SECOND_INSTANCE = "this identity already took part in this session and round"
NO_INPUT = "the masked-input stage came before this client was given its input"
BAD_INPUT = "the input does not fit the session, or came twice or after the masked-input stage"


@dataclass(frozen=True, kw_only=True)
class ClientPolicy:
    """What an honest client insists on before taking part.

    Attributes:
        require_active: refuse sessions not run in active (authenticated) mode. Default True;
            False is the semi-honest opt-in, safe only against a server that follows the protocol.
        corrupt: fraction of the population it assumes colludes with the server, in [0, 1). With
            the population size it fixes c_pop = floor(corrupt * population), hence the corrupt
            bound c = min(c_pop, n - 1) for a ring of n, the threshold floor and the survivor
            quorum it accepts (:mod:`protocols.masked.policy`). Never taken from the ring the
            server sends, which the server chooses.
        population: the number of enrolled clients, >= 1. Required when ``require_active`` is
            False (a semi-honest session has no directory of identities to count); in active mode
            the client uses the larger of this and the size of its directory of long-term keys. A
            ring larger than the population is refused.
        max_length: largest vector length it accepts, bounding the memory a server can demand, >= 1.
        max_degree: largest degree k (neighbours) it accepts, >= 2 (default 1024). Its Shamir
            sharing costs O(t k) field operations, so this bounds its work per session; larger
            federations use SecAgg+ (the Harary graph), whose degree grows like log n.
        max_ring: largest ring (clients named in the session parameters) it accepts, >= 3
            (default 2^20, the wire limit).
        clip: if set, the only clip (> 0) it accepts from the server; its DP noise and the
            server's decoding must agree on the scale.
        bits: if set, the only quantisation bits (1..64) it accepts. A server that raises ``bits``
            shrinks every client's integer DP noise relative to the signal: pin it when adding noise.
        min_word_slack: the least word slack (headroom per word for its shifted noise) it accepts,
            >= 0; set it to its noise's slack when adding noise.
        min_ring: the smallest ring (clients named in the session parameters) it takes part in,
            >= 1 (default 1: the protocol's own floor of 3 applies); a deployed site sets its
            policy's ``aggregation.min_sites``.
        min_threshold: the smallest reconstruction threshold it accepts, >= 1 (default 1: the
            corrupt-fraction floor applies); a deployed site sets ``aggregation.min_threshold``.
    """

    require_active: bool = True
    corrupt: float = 0.1
    population: int | None = None
    max_length: int = 1 << 28
    max_degree: int = 1024
    max_ring: int = 1 << 20
    clip: float | None = None
    bits: int | None = None
    min_word_slack: int = 0
    min_ring: int = 1
    min_threshold: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.require_active, bool):
            raise ValueError(f"require_active must be a bool, got {self.require_active!r}")
        if (isinstance(self.corrupt, bool) or not isinstance(self.corrupt, int | float)
                or not 0 <= self.corrupt < 1):
            raise ValueError(f"corrupt must be in [0, 1), got {self.corrupt!r}")
        if self.population is None:
            if not self.require_active:
                raise ValueError("population is required when require_active is False (semi-honest "
                                 "mode has no directory of identities to count)")
        elif not _is_int(self.population) or self.population < 1:
            raise ValueError(f"population must be an integer >= 1, got {self.population!r}")
        for name, low in (("max_length", 1), ("max_degree", 2), ("max_ring", 3), ("min_word_slack", 0),
                          ("min_ring", 1), ("min_threshold", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.clip is not None and (isinstance(self.clip, bool) or not isinstance(self.clip, int | float)
                                      or not 0 < self.clip < float("inf")):
            raise ValueError(f"clip must be None or a finite number > 0, got {self.clip!r}")
        if self.bits is not None and (not _is_int(self.bits) or not 1 <= self.bits <= 64):
            raise ValueError(f"bits must be None or an integer in [1, 64], got {self.bits!r}")

    def population_for(self, directory_size: int) -> int:
        """The population it counts corrupt clients in: its directory, or the size it was told."""
        return max(directory_size, self.population or 0)

    def refuses_encoding(self, clip: float, bits: int, word_slack: int) -> bool:
        """True when the server's encoder parameters differ from the ones pinned here."""
        return ((self.clip is not None and clip != self.clip) or (self.bits is not None and bits != self.bits)
                or word_slack < self.min_word_slack)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class _Context:
    client_id: int
    session: bytes
    round_index: int
    update: np.ndarray | None
    weight: int
    rng: np.random.Generator
    signing_key: crypto.SigningKey | None
    directory: Mapping[int, bytes]
    policy: ClientPolicy
    noise: Callable[[int], np.ndarray] | None = None
    sessions: SessionRecord = PROCESS_SESSIONS
    params: m.SessionParams | None = None
    graph: RingGraph | None = None
    encoder: FixedPointEncoder | None = None
    encoded: Encoded | None = None
    encryption: crypto.KeyPair | None = None
    masking: crypto.KeyPair | None = None
    neighbour_keys: dict[int, m.KeyEntry] = field(default_factory=dict)
    received: dict[int, tuple[int, int]] = field(default_factory=dict)
    survivors: tuple[int, ...] = ()
    seed: bytes = b""
    shares: np.ndarray | None = None
    commitments: bytes = b""
    quorum: int = 0
    digest: bytes = b""
    box_keys: dict[int, bytes] = field(default_factory=dict)
    clipped: int = 0
    length: int = 0

    def encode(self, refusal: str) -> None:
        """Encode the input (and add the noise) with the session's encoder: at the parameters
        stage for an input given at construction, at the masked-input stage for a late one; an input
        the encoder refuses (e.g. a weight above the public bound) aborts with ``refusal``."""
        p, encoder, update = self.params, self.encoder, self.update
        assert p is not None and encoder is not None and update is not None
        try:
            encoded = encoder.encode(update, self.weight, rng=self.rng)
        except SecAggError:
            raise ClientAbort(refusal) from None
        if self.noise is not None:
            extra = self.noise(p.length)
            if extra.shape != (p.length,) or int(extra.min()) < 0 or int(extra.max()) > p.word_slack:
                raise ClientAbort(UNSAFE_PARAMS)
            encoded.words[:-2] += extra.astype(encoded.words.dtype)
        self.encoded, self.clipped = encoded, encoded.clipped

    def header(self) -> m.Header:
        return m.Header(0, self.session, self.round_index, self.client_id, m.SERVER)

    def reply(self, body: m.Body) -> bytes:
        return m.encode(self.header(), body)

    def read(self, data: bytes, expect: type) -> m.Body:
        try:
            header, body = m.decode(data, expect=expect)
        except MalformedMessage:
            raise ClientAbort(MALFORMED) from None
        if header.session != self.session or header.round != self.round_index:
            raise ClientAbort(REPLAY)
        if header.sender != m.SERVER or header.recipient != self.client_id:
            raise ClientAbort(MALFORMED)
        return body

    @property
    def threshold(self) -> int:
        assert self.params is not None
        return self.params.threshold


class _Stage(ABC):
    """One stage of the client: the message it expects, and what it does with it."""

    expects: type

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx

    @abstractmethod
    def handle(self, body: m.Body) -> tuple[_Stage, bytes | None]:
        """Process ``body``; return the next stage and the reply (or raise ClientAbort)."""


class _AwaitParams(_Stage):
    expects = m.SessionParams

    def handle(self, p: m.SessionParams) -> tuple[_Stage, bytes]:
        ctx, policy = self.ctx, self.ctx.policy
        n = len(p.ring)
        # Bounds first, before any work that grows with the ring or the degree.
        if (n > policy.max_ring or n < policy.min_ring or p.threshold < policy.min_threshold
                or not 2 <= p.degree <= policy.max_degree or p.degree >= n
                or p.threshold > p.degree or policy.refuses_encoding(p.clip, p.bits, p.word_slack)):
            raise ClientAbort(UNSAFE_PARAMS)
        if p.active:
            population = policy.population_for(len(ctx.directory))
        elif policy.population is not None:
            population = policy.population
        else:
            raise ClientAbort(UNSAFE_PARAMS)  # semi-honest, and no population to count c in
        if n > population:
            raise ClientAbort(UNSAFE_PARAMS)
        try:
            graph = RingGraph(tuple(p.ring), p.degree)
        except SecAggError:
            raise ClientAbort(UNSAFE_PARAMS) from None
        if (ctx.client_id not in graph or p.length != ctx.length or p.length > policy.max_length
                or p.max_clients < n or (policy.require_active and not p.active)
                or (p.active and (ctx.signing_key is None or any(c not in ctx.directory for c in p.ring)))):
            raise ClientAbort(UNSAFE_PARAMS)
        floor = minimum_threshold(n, p.degree, policy.corrupt, active=p.active, population=population)
        if not floor <= p.threshold <= p.degree:
            raise ClientAbort(UNSAFE_PARAMS)
        try:
            encoder = FixedPointEncoder(clip=p.clip, bits=p.bits, max_clients=p.max_clients,
                                        max_weight=p.max_weight, max_length=p.max_length,
                                        word_slack=p.word_slack)
        except SecAggError:
            raise ClientAbort(UNSAFE_PARAMS) from None
        ctx.params, ctx.encoder = p, encoder
        if ctx.update is not None:  # an input given at construction is encoded (and checked) now
            ctx.encode(UNSAFE_PARAMS)
        identity = (ctx.signing_key.public if ctx.signing_key is not None
                    else b"client:" + str(ctx.client_id).encode())
        if not ctx.sessions.claim(identity, ctx.session, ctx.round_index):
            raise ClientAbort(SECOND_INSTANCE)
        ctx.graph = graph
        ctx.quorum = survivor_quorum(n, policy.corrupt, population=population)
        ctx.digest = m.params_digest(p)
        ctx.encryption, ctx.masking = crypto.KeyPair.generate(), crypto.KeyPair.generate()
        # Both secrets are shared now, at x = 1..k, so the commitment can be signed with the keys.
        ctx.seed = os.urandom(shamir.SECRET_BYTES)
        ctx.shares = shamir.split([ctx.seed, ctx.masking.private], threshold=p.threshold,
                                  xs=range(1, p.degree + 1))
        ctx.commitments = b"".join(
            share_hash(ctx.session, ctx.round_index, ctx.client_id, x, kind,
                       shamir.share_to_bytes(int(ctx.shares[kind, x - 1])))
            for x in range(1, p.degree + 1) for kind in (m.SHARE_OF_SEED, m.SHARE_OF_MASK_KEY))
        commitment = commitment_digest(ctx.commitments)
        signature = b""
        if p.active:
            assert ctx.signing_key is not None
            signature = ctx.signing_key.sign(key_message(ctx.session, ctx.round_index, ctx.client_id,
                                                         ctx.encryption.public, ctx.masking.public,
                                                         commitment, params=ctx.digest))
        entry = m.KeyEntry(ctx.client_id, ctx.encryption.public, ctx.masking.public, commitment,
                           signature)
        return _AwaitKeyList(ctx), ctx.reply(m.AdvertiseKeys(entry))


class _AwaitKeyList(_Stage):
    expects = m.KeyList

    def handle(self, body: m.KeyList) -> tuple[_Stage, bytes]:
        ctx = self.ctx
        assert ctx.graph is not None and ctx.params is not None
        ids = [e.client for e in body.entries]
        if len(set(ids)) != len(ids):
            raise ClientAbort(DUPLICATE_KEYS)
        own = [e for e in body.entries if e.client == ctx.client_id]
        if (len(own) != 1 or own[0].encryption_key != ctx.encryption.public
                or own[0].mask_key != ctx.masking.public
                or own[0].commitment != commitment_digest(ctx.commitments)):
            raise ClientAbort(OWN_KEY)
        all_keys = [e.encryption_key for e in body.entries] + [e.mask_key for e in body.entries]
        if len(set(all_keys)) != len(all_keys):
            raise ClientAbort(DUPLICATE_KEYS)
        for e in body.entries:
            if e.client != ctx.client_id and not ctx.graph.is_neighbour(ctx.client_id, e.client):
                raise ClientAbort(UNKNOWN_CLIENT)
            try:
                crypto.check_public_key(e.encryption_key)
                crypto.check_public_key(e.mask_key)
            except CryptoError:
                raise ClientAbort(BAD_KEY) from None
            if ctx.params.active:
                try:
                    crypto.verify(ctx.directory[e.client], e.signature,
                                  key_message(ctx.session, ctx.round_index, e.client,
                                              e.encryption_key, e.mask_key, e.commitment,
                                              params=ctx.digest))
                except CryptoError:
                    raise ClientAbort(BAD_SIGNATURE) from None
        neighbours = {e.client: e for e in body.entries if e.client != ctx.client_id}
        if len(neighbours) < ctx.threshold:
            raise ClientAbort(FEW_NEIGHBOURS)
        ctx.neighbour_keys = neighbours
        shares = ctx.shares
        assert shares is not None
        sealed = []
        for v in sorted(neighbours, key=lambda v: ctx.graph.x_of(ctx.client_id, v)):
            x = ctx.graph.x_of(ctx.client_id, v)
            plaintext = (shamir.share_to_bytes(int(shares[0, x - 1]))
                         + shamir.share_to_bytes(int(shares[1, x - 1])))
            box = share_box_key(ctx.encryption, neighbours[v].encryption_key,
                                ctx.session, ctx.round_index, ctx.client_id, v)
            ctx.box_keys[v] = box
            sealed.append((v, crypto.seal(box, plaintext, share_box_context(
                ctx.session, ctx.round_index, ctx.client_id, v))))
        ctx.shares = None
        return _AwaitShares(ctx), ctx.reply(m.ShareKeys(tuple(sealed), ctx.commitments))


class _AwaitShares(_Stage):
    expects = m.ForwardedShares

    def handle(self, body: m.ForwardedShares) -> tuple[_Stage, bytes]:
        ctx = self.ctx
        assert ctx.encoder is not None
        if ctx.encoded is None:  # a late input: encoded now, or refused when none was given
            if ctx.update is None:
                raise ClientAbort(NO_INPUT)
            ctx.encode(BAD_INPUT)
        assert ctx.encoded is not None
        senders = [v for v, _ in body.sealed]
        if len(set(senders)) != len(senders):
            raise ClientAbort(DUPLICATE_KEYS)
        if any(v not in ctx.neighbour_keys for v in senders):
            raise ClientAbort(UNKNOWN_CLIENT)
        if len(senders) < ctx.threshold:
            raise ClientAbort(FEW_NEIGHBOURS)
        for v, sealed in body.sealed:
            try:
                plain = crypto.open_sealed(ctx.box_keys[v], sealed, share_box_context(
                    ctx.session, ctx.round_index, v, ctx.client_id))
                if len(plain) != 2 * shamir.SHARE_BYTES:
                    raise ClientAbort(SHARE_AUTH)
                seed_share = shamir.share_from_bytes(plain[: shamir.SHARE_BYTES])
                key_share = shamir.share_from_bytes(plain[shamir.SHARE_BYTES:])
            except (CryptoError, shamir.ReconstructionError):
                raise ClientAbort(SHARE_AUTH) from None
            ctx.received[v] = (seed_share, key_share)
        words = ctx.encoded.words.copy()
        expander = MaskExpander(length=words.size, modulus_bits=ctx.encoder.modulus_bits)
        expander.add_into(self_mask_key(ctx.seed, ctx.session, ctx.round_index, ctx.client_id),
                          words, sign=+1)
        for v in sorted(ctx.received):
            key = mask_key(ctx.masking, ctx.neighbour_keys[v].mask_key, ctx.session,
                           ctx.round_index, ctx.client_id, v)
            expander.add_into(key, words, sign=+1 if ctx.client_id < v else -1)
        ctx.encoder.reduce(words)
        ctx.encoded = None  # the unmasked input is no longer needed
        bits = bytearray((ctx.params.degree + 7) // 8)
        for v in ctx.received:
            x = ctx.graph.x_of(ctx.client_id, v)
            bits[(x - 1) // 8] |= 1 << ((x - 1) % 8)
        partners, signature = bytes(bits), b""
        if ctx.params.active:
            signature = ctx.signing_key.sign(attestation_message(ctx.session, ctx.round_index,
                                                                 ctx.client_id, partners,
                                                                 params=ctx.digest))
        nxt: _Stage = _AwaitConsistency(ctx) if ctx.params.active else _AwaitUnmask(ctx)
        return nxt, ctx.reply(m.MaskedInput(ctx.encoder.to_bytes(words), partners, signature))


class _AwaitConsistency(_Stage):
    expects = m.ConsistencyRequest

    def handle(self, body: m.ConsistencyRequest) -> tuple[_Stage, bytes]:
        ctx = self.ctx
        survivors = tuple(sorted(body.survivors))
        if len(set(survivors)) != len(survivors) or any(c not in ctx.graph for c in survivors):
            raise ClientAbort(UNKNOWN_CLIENT)
        if ctx.client_id not in survivors:
            raise ClientAbort(SELF_DROPPED)
        # Signing S also attests that at least t of the partners it masked with are in S.
        if sum(1 for v in survivors if v in ctx.received) < ctx.threshold or len(survivors) < ctx.quorum:
            raise ClientAbort(FEW_SURVIVORS)
        ctx.survivors = survivors
        signature = ctx.signing_key.sign(consistency_message(ctx.session, ctx.round_index, survivors,
                                                             params=ctx.digest))
        return _AwaitUnmask(ctx), ctx.reply(m.ConsistencySignature(signature))


class _AwaitUnmask(_Stage):
    expects = m.UnmaskRequest

    def handle(self, body: m.UnmaskRequest) -> tuple[_Stage, bytes]:
        ctx = self.ctx
        alive, dropped = set(body.alive), set(body.dropped)
        if len(alive) != len(body.alive) or len(dropped) != len(body.dropped):
            raise ClientAbort(MALFORMED)
        if alive & dropped:
            raise ClientAbort(BOTH_LISTS)
        if ctx.client_id in dropped:
            raise ClientAbort(SELF_DROPPED)
        others = (alive | dropped) - {ctx.client_id}
        if any(v not in ctx.received for v in others):
            raise ClientAbort(UNKNOWN_CLIENT)
        if len(alive - {ctx.client_id}) < ctx.threshold:
            raise ClientAbort(FEW_SURVIVORS)
        if ctx.params.active:
            self._check_signatures(body, alive, dropped)
        shares = [(v, m.SHARE_OF_SEED, shamir.share_to_bytes(ctx.received[v][0]))
                  for v in sorted(alive - {ctx.client_id})]
        shares += [(v, m.SHARE_OF_MASK_KEY, shamir.share_to_bytes(ctx.received[v][1]))
                   for v in sorted(dropped)]
        ctx.received.clear()
        ctx.box_keys.clear()
        return _Done(ctx), ctx.reply(m.UnmaskResponse(tuple(shares)))

    def _check_signatures(self, body: m.UnmaskRequest, alive: set[int], dropped: set[int]) -> None:
        ctx = self.ctx
        survivors = set(ctx.survivors)
        if not alive <= survivors or dropped & survivors:
            raise ClientAbort(INCONSISTENT)
        message = consistency_message(ctx.session, ctx.round_index, ctx.survivors, params=ctx.digest)
        signers = set()
        for v, signature in body.signatures:
            if v in signers or v not in survivors or v not in ctx.graph:
                raise ClientAbort(INCONSISTENT)
            try:
                crypto.verify(ctx.directory[v], signature, message)
            except CryptoError:
                raise ClientAbort(BAD_SIGNATURE) from None
            signers.add(v)
        # Uniqueness: q > (n + c) / 2 signers means no other list can also have reached q.
        if len(signers) < ctx.quorum:
            raise ClientAbort(FEW_SURVIVORS)
        self._check_attestations(body, alive - {ctx.client_id} - signers, survivors)

    def _check_attestations(self, body: m.UnmaskRequest, unsigned: set[int], survivors: set[int]) -> None:
        """Every survivor whose seed share it reveals showed >= t of its partners in S.

        A survivor that signed S checked this itself before signing (:class:`_AwaitConsistency`);
        for each one in ``unsigned`` (in S, but no signature on S) the request must carry its
        signed partner attestation, and the client counts its partners in S.
        """
        ctx = self.ctx
        graph, k = ctx.graph, ctx.params.degree
        assert graph is not None
        attested = {}
        for owner, bits, signature in body.attestations:
            if owner in attested or owner not in unsigned or len(bits) != (k + 7) // 8:
                raise ClientAbort(ATTESTATION)
            try:
                crypto.verify(ctx.directory[owner], signature,
                              attestation_message(ctx.session, ctx.round_index, owner, bits,
                                                  params=ctx.digest))
            except CryptoError:
                raise ClientAbort(ATTESTATION) from None
            attested[owner] = bits
        if set(attested) != unsigned:
            raise ClientAbort(ATTESTATION)
        for owner, bits in attested.items():
            # neighbours() is ordered by x-coordinate, so bit x - 1 belongs to the holder at x.
            flags = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=k, bitorder="little")
            partners_in_s = sum(1 for w, flag in zip(graph.neighbours(owner), flags.tolist(), strict=True)
                                if flag and w in survivors)
            if partners_in_s < ctx.threshold:
                raise ClientAbort(ATTESTATION)


class _Done(_Stage):
    """The round is over for this client: it answers nothing more."""

    expects = type(None)

    def handle(self, body: m.Body) -> tuple[_Stage, bytes | None]:
        raise ClientAbort(MALFORMED)


class MaskedClient:
    """One honest client for one (session, round).

    Args:
        client_id: its id, as listed in the server's ring.
        session: the 16-byte session id it expects (messages of any other session are refused).
        round_index: the round it expects.
        update: its float vector (length fixed by the session parameters), or None for an input
            given later with :meth:`provide`, before the masked-input stage (then ``length`` is
            required). Keys, shares and commitments do not depend on the input, which enters
            only the masked input: a late input is encoded at that stage, and a masked-input
            stage without one is refused (``NO_INPUT``).
        weight: its integer weight n_k (ignored when ``update`` is None).
        length: the input's length when ``update`` is None (>= 1; ignored otherwise).
        rng: randomness for stochastic rounding only (keys, seeds and masks use the OS CSPRNG).
        signing_key: its long-term Ed25519 key (active mode).
        directory: long-term Ed25519 public keys of all clients, by id (active mode).
        policy: what it insists on.
        noise: length -> non-negative integers (each at most the session's word slack) that
            it adds to its encoded value words before masking (client-level DP noise, shifted).
        sessions: where this identity records the (session, round) pairs it took part in; a
            second instance of one pair aborts before drawing any key
            (:mod:`protocols.masked.sessions`; default: the process-wide record).
    """

    def __init__(self, *, client_id: int, session: bytes, round_index: int, update: np.ndarray | None,
                 weight: int, rng: np.random.Generator, signing_key: crypto.SigningKey | None = None,
                 directory: Mapping[int, bytes] | None = None, policy: ClientPolicy | None = None,
                 noise: Callable[[int], np.ndarray] | None = None,
                 sessions: SessionRecord | None = None, length: int | None = None) -> None:
        if update is None:
            if not _is_int(length) or length < 1:
                raise ValueError(f"a client without an input needs its length (an integer >= 1), "
                                 f"got {length!r}")
        else:
            length = int(update.size)
        ctx = _Context(client_id, session, round_index, update, weight, rng, signing_key,
                       dict(directory or {}), policy or ClientPolicy(), noise,
                       sessions if sessions is not None else PROCESS_SESSIONS, length=int(length))
        self._stage: _Stage | None = _AwaitParams(ctx)
        self._ctx = ctx
        self.abort_reason: str | None = None

    @property
    def stage(self) -> str:
        return "aborted" if self._stage is None else type(self._stage).__name__.strip("_")

    @property
    def clipped(self) -> int:
        """Values clipped when its update was encoded (0 before the parameters arrive)."""
        return self._ctx.clipped

    @property
    def awaits_input(self) -> bool:
        """True while this client was built without an input and has not been given one."""
        return self._ctx.update is None

    def provide(self, update: np.ndarray, weight: int) -> None:
        """Give a client built without an input its input, before its masked-input stage.

        Raises:
            ClientAbort: ``BAD_INPUT`` (an input already given, the masked input already sent,
                the client aborted or done, or a vector of another length), the client is then
                aborted; ``ABORTED`` when it had aborted before.
        """
        if self._stage is None:
            raise ClientAbort(ABORTED)
        ctx = self._ctx
        vector = np.asarray(update)
        if (ctx.update is not None or not isinstance(self._stage, _AwaitParams | _AwaitKeyList | _AwaitShares)
                or vector.ndim != 1 or vector.size != ctx.length or isinstance(weight, bool)
                or not isinstance(weight, int | np.integer)):
            self._stage, self.abort_reason = None, BAD_INPUT
            raise ClientAbort(BAD_INPUT)
        ctx.update, ctx.weight = vector, int(weight)

    def handle(self, data: bytes) -> bytes | None:
        """Process one message from the server; returns the reply, or raises ClientAbort."""
        if self._stage is None or isinstance(self._stage, _Done):
            raise ClientAbort(ABORTED if self._stage is None else MALFORMED)
        stage = self._stage
        try:
            body = self._ctx.read(data, stage.expects)
            nxt, reply = stage.handle(body)
        except ClientAbort as abort:
            self._stage = None
            self.abort_reason = abort.reason
            raise
        self._stage = nxt
        return reply
