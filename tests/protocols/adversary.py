"""A lying server (with colluding clients) that drives the project's UNMODIFIED honest clients.

The adversary is the server plus the clients in ``corrupt``: it sees every message, can drop,
withhold or re-route any of them, can show every client a different key list, bundle set,
survivor list and alive/dropped split, signs anything with the colluders' identity keys, and
reads every colluder's state (its own secrets and the shares it holds). It cannot forge an
honest client's signature or open a share bundle not addressed to a colluder.

A :class:`Strategy` fixes every choice; :func:`attack` plays it and reports which honest
inputs the adversary can compute. Client ``v``'s masked input is
``y_v = x_v + PRG(seed_v) + sum_{w in P_v} +-PRG(mask key of v, w)``, so the adversary learns
``x_v`` exactly when it holds ``y_v``, ``seed_v`` and, for every partner ``w`` in ``P_v``, the
private mask key of ``v`` or of ``w`` (a colluder's key, or t shares of it). Secrets count as
known when t shares at distinct x-coordinates were revealed; for a break the harness also
rebuilds them from the shares and recomputes ``x_v`` to confirm it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.graph import RingGraph
from fedsec.protocols.masked.keys import consistency_message, mask_key, self_mask_key
from fedsec.protocols.masked.policy import minimum_threshold
from fedsec.protocols.masked.simulation import build_round
from fedsec.secagg import shamir
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.keys import KeyPair, SigningKey
from fedsec.secagg.prg import MaskExpander

LENGTH = 4


@dataclass
class World:
    """A round among n clients (ids 1..n on ring 1..n), some of them colluding with the server."""

    active: bool
    graph: RingGraph
    threshold: int
    corrupt: frozenset[int]
    session: bytes
    clients: dict
    params: dict[int, bytes]
    identities: dict[int, SigningKey]
    encoder: FixedPointEncoder
    plain: dict[int, np.ndarray]
    digest: bytes

    @property
    def honest(self) -> list[int]:
        return [c for c in self.graph.ring if c not in self.corrupt]


def make_world(n: int, degree: int, *, active: bool, corrupt: frozenset[int] = frozenset(),
               assumed_corrupt: float = 0.2, threshold: int | None = None) -> World:
    """Clients 1..n; the policy and the server assume ``assumed_corrupt``; t is the floor unless given."""
    ids = list(range(1, n + 1))
    floor = minimum_threshold(n, degree, assumed_corrupt, active=active, population=n)
    t = threshold or floor
    encoder = FixedPointEncoder(clip=1.0, bits=8, max_clients=n, max_weight=10, max_length=LENGTH)
    rng = np.random.default_rng(n * 100 + degree)
    updates = {c: rng.normal(0, 0.3, LENGTH).astype(np.float32) for c in ids}
    identities = {c: SigningKey.generate() for c in ids}
    built = build_round(updates=updates, weights={c: c for c in ids},
                        rngs={c: np.random.default_rng(c) for c in ids}, encoder=encoder,
                        degree=degree, threshold=floor, round_index=3,
                        identities=identities if active else None, active=active,
                        corrupt=assumed_corrupt)
    # A fixed ring order keeps strategies reproducible; the clients learn it from the parameters.
    graph = RingGraph(tuple(ids), degree)
    params = {}
    for c in ids:
        body = m.SessionParams(graph.ring, degree, t, LENGTH, encoder.clip, encoder.bits, encoder.max_clients,
                               encoder.max_weight, encoder.max_length, active, encoder.word_slack)
        params[c] = m.encode(m.Header(0, built.session, 3, m.SERVER, c), body)
    plain = {c: encoder.encode(updates[c], c, rng=np.random.default_rng(c)).words for c in ids}
    return World(active, graph, t, frozenset(corrupt), built.session, built.clients, params, identities,
                 encoder, plain, m.params_digest(body))


@dataclass
class Strategy:
    """Every choice of the lying server. ``None`` means 'what an honest server would do'.

    key_lists: client -> neighbours whose key entries it is shown.
    forward: client -> senders whose share bundles are forwarded to it.
    lists: the survivor lists in play (tuples of ids).
    shown: client -> index into ``lists`` shown at the consistency check (active mode) and used
        for its alive/dropped split at unmasking (both modes).
    """

    key_lists: dict[int, frozenset[int]] = field(default_factory=dict)
    forward: dict[int, frozenset[int]] = field(default_factory=dict)
    lists: tuple[tuple[int, ...], ...] = ()
    shown: dict[int, int] = field(default_factory=dict)


@dataclass
class Outcome:
    broken: dict[int, np.ndarray]
    """Honest client -> its encoded input, recomputed by the adversary from what it saw."""
    answered_unmask: set[int]
    aborts: dict[int, str]


def _send(world: World, clients: dict, c: int, body, aborts: dict[int, str]):
    if c in aborts:
        return None
    data = m.encode(m.Header(0, world.session, 3, m.SERVER, c), body)
    try:
        reply = clients[c].handle(data)
    except ClientAbort as abort:
        aborts[c] = abort.reason
        return None
    return m.decode(reply, expect=_REPLY[type(body)])[1]


_REPLY = {m.KeyList: m.ShareKeys, m.ForwardedShares: m.MaskedInput,
          m.ConsistencyRequest: m.ConsistencySignature, m.UnmaskRequest: m.UnmaskResponse}


@dataclass
class Prepared:
    """The round after the masked inputs: what the adversary holds, and the clients' state."""

    world: World
    entries: dict[int, m.KeyEntry]
    sealed: dict[int, dict[int, bytes]]
    masked: dict[int, np.ndarray]
    partners: dict[int, set[int]]
    attestations: dict[int, tuple[bytes, bytes]]
    held: dict[int, dict[int, tuple[int, int]]]
    colluder_keys: dict[int, KeyPair]
    aborts: dict[int, str]


def prepare(world: World, strategy: Strategy) -> Prepared:
    """Play the key lists and bundle forwarding of ``strategy`` up to the masked inputs."""
    g, ring, aborts = world.graph, world.graph.ring, {}
    entries = {}
    for c in ring:
        try:
            reply = world.clients[c].handle(world.params[c])
        except ClientAbort as abort:
            aborts[c] = abort.reason
            continue
        entries[c] = m.decode(reply, expect=m.AdvertiseKeys)[1].entry
    sealed: dict[int, dict[int, bytes]] = {}
    for c in ring:
        shown = strategy.key_lists.get(c, frozenset(g.neighbours(c)))
        if c not in entries:
            continue
        body = m.KeyList((entries[c],) + tuple(entries[v] for v in g.neighbours(c)
                                               if v in shown and v in entries))
        reply = _send(world, world.clients, c, body, aborts)
        if reply is not None:
            sealed[c] = dict(reply.sealed)
    masked, partners, attestations = {}, {}, {}
    for c in ring:
        if c not in sealed:
            continue
        allowed = strategy.forward.get(c, frozenset(ring))
        bundles = tuple((v, sealed[v][c]) for v in g.neighbours(c)
                        if v in sealed and c in sealed[v] and v in allowed)
        reply = _send(world, world.clients, c, m.ForwardedShares(bundles), aborts)
        if reply is not None:
            masked[c] = world.encoder.from_bytes(reply.words, LENGTH + 2)
            partners[c] = {v for v, _ in bundles}
            attestations[c] = (reply.partners, reply.signature)
    # Colluders' holdings and secrets, read before unmasking clears them.
    held = {c: dict(world.clients[c]._ctx.received) for c in world.corrupt}
    colluder_keys = {c: world.clients[c]._ctx.masking for c in world.corrupt if c in entries}
    return Prepared(world, entries, sealed, masked, partners, attestations, held, colluder_keys, aborts)


def finish(prep: Prepared, lists: tuple[tuple[int, ...], ...] = (), shown: dict[int, int] | None = None,
           *, fork: bool = True) -> Outcome:
    """Play the survivor lists: ``shown[c]`` indexes the list client c is shown (default 0)."""
    world, g, ring = prep.world, prep.world.graph, prep.world.graph.ring
    clients = copy.deepcopy(world.clients) if fork else world.clients
    aborts, shown = dict(prep.aborts), shown or {}
    masked, partners = prep.masked, prep.partners
    lists = lists or (tuple(sorted(masked)),)
    signatures: dict[int, dict[int, bytes]] = {i: {} for i in range(len(lists))}
    if world.active:
        for i, lst in enumerate(lists):  # colluders sign every list
            for c in world.corrupt:
                signatures[i][c] = world.identities[c].sign(consistency_message(
                    world.session, 3, lst, params=world.digest))
        for c in ring:
            if c in masked and c not in world.corrupt:
                i = shown.get(c, 0)
                reply = _send(world, clients, c, m.ConsistencyRequest(lists[i]), aborts)
                if reply is not None:
                    signatures[i][c] = reply.signature
    revealed: dict[tuple[int, int], dict[int, bytes]] = {}
    answered = set()
    for c in ring:
        if c in world.corrupt or c not in masked:
            continue
        i = shown.get(c, 0)
        lst = set(lists[i])
        holds = [v for v in g.neighbours(c) if v in partners[c]]
        alive = tuple(v for v in holds if v in lst)
        dropped = tuple(v for v in holds if v not in lst)
        sigs = tuple(sorted(signatures[i].items()))
        atts = tuple((v, *prep.attestations[v]) for v in alive
                     if world.active and v not in signatures[i] and v in prep.attestations)
        reply = _send(world, clients, c, m.UnmaskRequest(alive, dropped, sigs, atts), aborts)
        if reply is None:
            continue
        answered.add(c)
        for owner, kind, share in reply.shares:
            revealed.setdefault((owner, kind), {})[g.x_of(owner, c)] = share
    for c, shares in prep.held.items():
        for owner, (seed_share, key_share) in shares.items():
            x = g.x_of(owner, c)
            revealed.setdefault((owner, m.SHARE_OF_SEED), {})[x] = shamir.share_to_bytes(seed_share)
            revealed.setdefault((owner, m.SHARE_OF_MASK_KEY), {})[x] = shamir.share_to_bytes(key_share)
    return Outcome(_broken(prep, revealed), answered, aborts)


def attack(world: World, strategy: Strategy) -> Outcome:
    """Play the whole of ``strategy`` against the world's clients (consumes them)."""
    return finish(prepare(world, strategy), strategy.lists, strategy.shown, fork=False)


def _rebuild(revealed, owner: int, kind: int, t: int) -> bytes | None:
    points = revealed.get((owner, kind), {})
    if len(points) < t:
        return None
    xs = tuple(sorted(points)[:t])
    return shamir.combine_one(xs, [points[x] for x in xs])


def _broken(prep: Prepared, revealed) -> dict[int, np.ndarray]:
    world, masked, partners, entries = prep.world, prep.masked, prep.partners, prep.entries
    t, s = world.threshold, world.session
    keys: dict[int, KeyPair] = dict(prep.colluder_keys)
    for c in world.graph.ring:
        if c not in keys:
            private = _rebuild(revealed, c, m.SHARE_OF_MASK_KEY, t)
            if private is not None:
                keys[c] = KeyPair.from_private(private)
    broken = {}
    expander = MaskExpander(length=LENGTH + 2, modulus_bits=world.encoder.modulus_bits)
    for v in world.honest:
        if v not in masked:
            continue
        seed = _rebuild(revealed, v, m.SHARE_OF_SEED, t)
        if seed is None or not (v in keys or all(w in keys for w in partners[v])):
            continue
        words = masked[v].copy()
        expander.add_into(self_mask_key(seed, s, 3, v), words, sign=-1)
        for w in partners[v]:
            own, peer = (keys[v], entries[w].mask_key) if v in keys else (keys[w], entries[v].mask_key)
            expander.add_into(mask_key(own, peer, s, 3, v, w), words, sign=-1 if v < w else +1)
        world.encoder.reduce(words)
        broken[v] = words
    return broken


def confirmed(world: World, outcome: Outcome) -> bool:
    """Every input the harness claims broken really is the victim's encoded input."""
    return all(np.array_equal(words, world.plain[v]) for v, words in outcome.broken.items())

