"""The server of the pairwise-mask protocol: one small state class per stage.

The server drives the round: :meth:`MaskedServer.outgoing` gives the messages of the current
stage, :meth:`MaskedServer.receive` takes the clients' answers (a malformed or unexpected answer
removes its sender from the round and is counted, never trusted), :meth:`MaskedServer.close`
ends the stage. A stage that leaves fewer than t clients, or any client of the sum with fewer than
t answering share holders, raises :class:`protocols.errors.ProtocolAbort`: never a wrong sum.

A client removed from the round (a malformed or invalid message up to and including its masked
input) is listed in :attr:`MaskedServer.rejected` and is never in the sum. Once a client's masked
input is in the total it cannot leave the sum: a malformed consistency signature or unmask answer
is listed in :attr:`MaskedServer.misbehaved`, the client counts as a non-signer or non-answerer, and
nothing it sends afterwards is taken. Other misbehaviour that does not remove a client (a repeated
message; a share at unmasking that does not match its owner's commitment, which is then left out
of the reconstruction) is listed there too.

The masks are removed from the partner sets the survivors attested with their masked inputs
(signed in active mode), not from what the server believes it forwarded: for a dropped client d,
exactly the masks of the survivors v with d in P_v; survivors v, w with v in P_w but w not in P_v
cannot cancel, and the round aborts before anyone reveals a share.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from fedsec.protocols.errors import MalformedMessage, ProtocolAbort
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.deferred import DeferredHashes, DeferredSignatures
from fedsec.protocols.masked.framing import KeyListBodies, UnmaskRequestBodies, body_bytes, frame
from fedsec.protocols.masked.graph import RingGraph
from fedsec.protocols.masked.keys import (
    COMMITMENT_BYTES,
    ShareHasher,
    attestation_message,
    commitment_digest,
    consistency_message,
    key_message,
    mask_key,
    self_mask_key,
)
from fedsec.protocols.masked.policy import minimum_threshold, survivor_quorum
from fedsec.protocols.masked.routing import BundleRouter
from fedsec.protocols.masked.workers import (
    Job,
    KeyJob,
    SeedJob,
    check_workers,
    shared_pool,
)
from fedsec.secagg import keys as crypto
from fedsec.secagg import shamir
from fedsec.secagg.encoding import FixedPointEncoder
from fedsec.secagg.errors import CryptoError, SecAggError
from fedsec.secagg.prg import MaskSum, quick_switches

KEY_SIGNATURE = "key signature does not verify"
SURVIVOR_SIGNATURE = "survivor signature does not verify"
ATTESTATION = "partner attestation does not verify"
_PRIME_BYTES = np.frombuffer(shamir.PRIME.to_bytes(shamir.SHARE_BYTES, "big"), dtype=np.uint8)


def _at_least_prime(points: np.ndarray) -> np.ndarray:
    """For (n, SHARE_BYTES) uint8 rows of big-endian integers: which are >= the field prime (the
    first byte that differs from the prime's decides; none differs: equal)."""
    differs = points != _PRIME_BYTES
    first = differs.argmax(axis=1)
    above = points[np.arange(points.shape[0]), first] > _PRIME_BYTES[first]
    return ~differs.any(axis=1) | above


@dataclass
class _Round:
    session: bytes
    round_index: int
    graph: RingGraph
    params: m.SessionParams
    encoder: FixedPointEncoder
    directory: Mapping[int, bytes]
    quorum: int
    digest: bytes
    keys: dict[int, m.KeyEntry] = field(default_factory=dict)
    shared: frozenset[int] = frozenset()
    """The clients whose share bundles were taken (each addressed every neighbour in ``keys``)."""
    router: BundleRouter | None = None
    commitments: dict[int, bytes] = field(default_factory=dict)
    attestations: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    partners: dict[int, np.ndarray] = field(default_factory=dict)
    """Each masked input's attested partner set P_v, as k flags by x-coordinate (x - 1)."""
    flags: np.ndarray | None = None
    """The survivors' partner flags, one row each in survivor order (shape (|S|, k))."""
    neighbours: np.ndarray | None = None
    """The ring indices of the survivors' neighbours, same shape, by x-coordinate."""
    alive_at: np.ndarray | None = None
    """Survivor flags by ring index."""
    ignored: set[int] = field(default_factory=set)
    total: np.ndarray | None = None
    survivors: tuple[int, ...] = ()
    signatures: dict[int, bytes] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    misbehaved: dict[int, str] = field(default_factory=dict)
    profile: dict[str, float] = field(default_factory=dict)
    workers: int = 1
    """Processes computing the unmask stage, this one included (1: this process only)."""

    @property
    def threshold(self) -> int:
        return self.params.threshold

    def message(self, recipient: int, kind: int, body: bytes | list[bytes]) -> bytes:
        """The server's message of ``kind`` to ``recipient`` with the serialised ``body``."""
        return frame(kind, self.session, self.round_index, recipient, body)

    def require(self, clients: int, stage: str) -> None:
        if clients < self.threshold:
            raise ProtocolAbort(f"{stage}: {clients} client(s) left, threshold is {self.threshold}")


class _Stage(ABC):
    """One stage of the server: what it sends, how it checks answers, and how it ends."""

    expects: type
    name: str
    in_sum = False
    """True once the members' masked inputs are in the total (a bad answer cannot remove them)."""

    def __init__(self, r: _Round, members: tuple[int, ...]) -> None:
        self.r = r
        self.members = members
        self.member_set = frozenset(members)
        self.answers: dict[int, m.Body] = {}
        self.deferred: DeferredSignatures | None = None
        """Signature checks sent to the worker pool (``workers`` > 1), settled by :meth:`settle`."""
        self.repeats: set[int] = set()
        """Senders first listed in ``misbehaved`` by a repeated answer of this stage."""

    def check_signature(self, sender: int, signature: bytes, message: bytes, reason: str,
                        payload: object = None) -> None:
        """Verify ``sender``'s Ed25519 signature on ``message`` now (MalformedMessage(reason) if it
        does not verify) or, with worker processes, in the pool while later answers are read: then
        :meth:`settle`, at the stage's end, treats a failure exactly as an immediate one (and
        :meth:`apply` takes the ``payload`` of each good one)."""
        public = self.r.directory[sender]
        if self.r.workers < 2:
            try:
                crypto.verify(public, signature, message)
            except CryptoError:
                raise MalformedMessage(reason) from None
            return
        if self.deferred is None:
            self.deferred = DeferredSignatures(shared_pool(self.r.workers))
        self.deferred.add(sender, public, signature, message, payload)

    def apply(self, sender: int, payload: object) -> None:  # noqa: B027 - optional hook
        """Take the answer of ``sender`` whose deferred signature verified (nothing by default)."""

    def settle(self, reason: str, *, verdicts: list[tuple[int, object, bool]] | None = None) -> None:
        """End the deferred signature checks: each sender whose signature failed is removed as if
        its answer had been refused when it arrived (rejected, or misbehaved and ignored once its
        input is in the sum); a repeated answer it sent meanwhile, which the immediate check would
        have ignored silently, is not counted. WorkerError if a worker failed."""
        if verdicts is None:
            if self.deferred is None:
                return
            verdicts, self.deferred = self.deferred.finish(), None
        for c, payload, ok in verdicts:
            if ok:
                self.apply(c, payload)
                continue
            del self.answers[c]
            if self.in_sum:
                self.r.misbehaved[c] = f"{self.name}: {reason}"
                self.r.ignored.add(c)
            else:
                self.r.rejected[c] = reason
                if c in self.repeats:
                    del self.r.misbehaved[c]

    @abstractmethod
    def outgoing(self) -> dict[int, bytes]:
        """This stage's message to each member."""

    def accept(self, sender: int, body: m.Body) -> None:  # noqa: B027 - optional hook
        """Validate one answer beyond parsing; raise MalformedMessage to reject its sender.

        The default accepts every answer that parsed."""
        return None

    @abstractmethod
    def close(self) -> _Stage | None:
        """End the stage: the next stage, None when the round is complete; or ProtocolAbort."""


class _AdvertiseKeys(_Stage):
    expects, name = m.AdvertiseKeys, "advertise keys"

    def outgoing(self) -> dict[int, bytes]:
        body = body_bytes(self.r.params)  # one ring for everybody: serialised once
        return {c: self.r.message(c, m.SessionParams.KIND, body) for c in self.members}

    def accept(self, sender: int, body: m.AdvertiseKeys) -> None:
        e = body.entry
        if e.client != sender:
            raise MalformedMessage("key entry names another client")
        try:
            crypto.check_public_key(e.encryption_key)
            crypto.check_public_key(e.mask_key)
        except CryptoError:
            raise MalformedMessage("a public key is malformed or of small order") from None
        if self.r.params.active:
            self.check_signature(sender, e.signature,
                                 key_message(self.r.session, self.r.round_index, sender,
                                             e.encryption_key, e.mask_key, e.commitment,
                                             params=self.r.digest), KEY_SIGNATURE)

    def close(self) -> _Stage:
        self.settle(KEY_SIGNATURE)
        seen: set[bytes] = set()
        for c, body in sorted(self.answers.items()):
            e = body.entry
            if e.encryption_key in seen or e.mask_key in seen or e.encryption_key == e.mask_key:
                self.r.rejected[c] = "duplicate public key"
                continue
            seen.update((e.encryption_key, e.mask_key))
            self.r.keys[c] = e
        self.r.require(len(self.r.keys), self.name)
        return _ShareKeys(self.r, tuple(sorted(self.r.keys)))


class _ShareKeys(_Stage):
    expects, name = m.SharedBundles, "share keys"

    def __init__(self, r: _Round, members: tuple[int, ...]) -> None:
        super().__init__(r, members)
        self.keyed = np.zeros(len(r.graph.ring), dtype=bool)
        """Flags by ring index: the clients whose key entries were accepted."""
        self.keyed[r.graph.positions(np.array(sorted(r.keys), dtype=np.uint64))] = True
        self.ring = np.array(r.graph.ring, dtype=np.uint64)

    def outgoing(self) -> dict[int, bytes]:
        keys, graph = self.r.keys, self.r.graph
        bodies = KeyListBodies(keys)  # each entry goes to k + 1 clients: packed once
        return {c: self.r.message(c, m.KeyList.KIND,
                                  bodies.body([c, *(v for v in graph.neighbours(c) if v in keys)]))
                for c in self.members}

    def accept(self, sender: int, body: m.SharedBundles) -> None:
        graph = self.r.graph
        # Exactly the neighbours in ``keys``, each once (they are distinct: compare sorted).
        around = graph.neighbour_positions(np.array([graph.position(sender)]))[0]
        expected = np.sort(self.ring[around[self.keyed[around]]])
        recipients = body.rows["peer"]
        if recipients.size != expected.size or not np.array_equal(np.sort(recipients), expected):
            raise MalformedMessage("share bundles are not addressed to exactly the neighbours")
        size = m.SHARE_HASHES_PER_HOLDER * COMMITMENT_BYTES * self.r.graph.degree
        if (len(body.commitments) != size
                or commitment_digest(body.commitments) != self.r.keys[sender].commitment):
            raise MalformedMessage("share commitments do not match the advertised digest")

    def close(self) -> _Stage:
        router = BundleRouter(self.r.graph)
        for c in sorted(self.answers):
            body = self.answers[c]
            router.add_rows(c, body.rows)
            self.r.commitments[c] = body.commitments
        self.r.require(len(self.answers), self.name)
        router.seal()
        self.r.router, self.r.shared = router, frozenset(self.answers)
        return _MaskedInput(self.r, tuple(sorted(self.answers)))


class _MaskedInput(_Stage):
    expects, name = m.MaskedInput, "masked input"

    def __init__(self, r: _Round, members: tuple[int, ...]) -> None:
        super().__init__(r, members)
        self.shared_at = np.zeros(len(r.graph.ring), dtype=bool)
        self.shared_at[r.graph.positions(np.array(sorted(r.shared), dtype=np.uint64))] = True

    def outgoing(self) -> dict[int, bytes]:
        router = self.r.router
        assert router is not None
        return {c: self.r.message(c, m.ForwardedShares.KIND, router.body(c)) for c in self.members}

    def accept(self, sender: int, body: m.MaskedInput) -> None:
        try:
            words = self.r.encoder.from_bytes(body.words, self.r.params.length + 2)
        except SecAggError:
            raise MalformedMessage("masked input has the wrong size or range") from None
        if (self.r.encoder.modulus_bits < 8 * words.itemsize and words.size
                and int(words.max()) >> self.r.encoder.modulus_bits):
            raise MalformedMessage("masked input has a word outside the modulus")
        partners = self._partners(sender, body.partners)
        if self.r.params.active:
            message = attestation_message(self.r.session, self.r.round_index, sender, body.partners,
                                          params=self.r.digest)
            if self.r.workers > 1:  # checked by the pool; taken by apply once it verifies
                if self.deferred is not None:  # the verdicts in so far (never this sender's)
                    self.settle(ATTESTATION, verdicts=self.deferred.ready())
                self.check_signature(sender, body.signature, message, ATTESTATION, (body, partners, words))
                return
            try:
                crypto.verify(self.r.directory[sender], body.signature, message)
            except CryptoError:
                raise MalformedMessage(ATTESTATION) from None
        self.apply(sender, (body, partners, words))

    def apply(self, sender: int, payload: object) -> None:
        body, partners, words = payload  # type: ignore[misc]
        if self.r.params.active:
            self.r.attestations[sender] = (body.partners, body.signature)
        self.r.partners[sender] = partners
        if self.r.total is None:
            self.r.total = np.zeros(words.size, dtype=self.r.encoder.dtype)
        self.answers[sender] = body
        np.add(self.r.total, words, out=self.r.total)

    def _partners(self, sender: int, bits: bytes) -> np.ndarray:
        """P_sender from its partner bitmap, as k flags: bit x - 1 is its neighbour at x-coordinate
        x. Only neighbours whose bundle the server forwarded to it, at least t of them."""
        graph, k = self.r.graph, self.r.graph.degree
        if len(bits) != (k + 7) // 8:
            raise MalformedMessage("partner attestation has the wrong size")
        flags = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little").astype(bool)
        if flags[k:].any():
            raise MalformedMessage("partner attestation sets a bit beyond the degree")
        flags = flags[:k]
        at = graph.neighbour_positions(np.array([graph.position(sender)]))[0][flags]
        # A partner in ``shared`` addressed a bundle to every neighbour in ``keys``, the sender too.
        if at.size < self.r.threshold or not self.shared_at[at].all():
            raise MalformedMessage("partner attestation names fewer than t partners or one whose "
                                   "bundle it was never sent")
        return flags

    def close(self) -> _Stage:
        self.settle(ATTESTATION)
        r = self.r
        r.survivors = tuple(sorted(self.answers))
        r.require(len(r.survivors), self.name)
        graph, k = r.graph, r.graph.degree
        at = graph.positions(np.array(r.survivors, dtype=np.uint64))
        r.flags = np.array([r.partners[v] for v in r.survivors], dtype=bool).reshape(-1, k)
        r.neighbours = graph.neighbour_positions(at)
        r.alive_at = np.zeros(len(graph.ring), dtype=bool)
        r.alive_at[at] = True
        row_at = np.full(len(graph.ring), -1, dtype=np.int64)
        row_at[at] = np.arange(at.size)
        # v masked with w (w alive): w must have masked with v, whom w sees at x' = k + 1 - x.
        mutual = r.flags & r.alive_at[r.neighbours]
        reverse = r.flags[row_at[r.neighbours], np.arange(k)[::-1]]
        lost = np.argwhere(mutual & ~reverse)
        if lost.size:
            row, column = lost[0].tolist()
            v, w = r.survivors[row], graph.ring[int(r.neighbours[row, column])]
            raise ProtocolAbort(f"{self.name}: client {v} masked with client {w} but not the "
                                "reverse (a share bundle was lost): the masks cannot cancel")
        if self.r.params.active:
            return _Consistency(self.r, self.r.survivors)
        return _Unmask(self.r, self.r.survivors)


class _Consistency(_Stage):
    expects, name = m.ConsistencySignature, "consistency check"
    in_sum = True

    def __init__(self, r: _Round, members: tuple[int, ...]) -> None:
        super().__init__(r, members)
        self.statement: bytes | None = None

    def outgoing(self) -> dict[int, bytes]:
        body = body_bytes(m.ConsistencyRequest(self.r.survivors))
        return {c: self.r.message(c, m.ConsistencyRequest.KIND, body) for c in self.members}

    def accept(self, sender: int, body: m.ConsistencySignature) -> None:
        if self.statement is None:  # one list for everybody: serialised once
            self.statement = consistency_message(self.r.session, self.r.round_index, self.r.survivors,
                                                 params=self.r.digest)
        self.check_signature(sender, body.signature, self.statement, SURVIVOR_SIGNATURE)

    def close(self) -> _Stage:
        self.settle(SURVIVOR_SIGNATURE)
        self.r.signatures = {c: body.signature for c, body in self.answers.items()}
        self.r.require(len(self.r.signatures), self.name)
        if len(self.r.signatures) < self.r.quorum:
            raise ProtocolAbort(f"{self.name}: {len(self.r.signatures)} signature(s) on the survivor "
                                f"list, the clients' quorum is {self.r.quorum}")
        return _Unmask(self.r, tuple(sorted(self.r.signatures)))


class _Unmask(_Stage):
    expects, name = m.UnmaskShares, "unmask"
    in_sum = True

    def __init__(self, r: _Round, members: tuple[int, ...]) -> None:
        super().__init__(r, members)
        assert r.flags is not None and r.neighbours is not None and r.alive_at is not None
        ring = np.array(r.graph.ring, dtype=np.uint64)
        # The dropped clients whose masks are in the sum: d in P_v for a survivor v (attested).
        rows, columns = np.nonzero(r.flags & ~r.alive_at[r.neighbours])
        at = r.neighbours[rows, columns]
        order = np.argsort(at, kind="stable")  # by d, then survivor order
        at, rows = at[order], rows[order]
        bounds = np.flatnonzero(np.diff(at)) + 1
        survivors = np.array(r.survivors, dtype=np.uint64)
        self.needs: dict[int, list[int]] = {
            int(ring[group[0]]): survivors[members_of].tolist()
            for group, members_of in zip(np.split(at, bounds), np.split(rows, bounds), strict=True)
            if group.size}
        self.dropped = tuple(sorted(self.needs))
        # A holder is asked about exactly the owners whose shares it attested to hold: the seed
        # share of each alive one, the mask-key share of each dropped one (ids ascending).
        row_of = {v: i for i, v in enumerate(r.survivors)}
        self.lists: dict[int, tuple[list[int], list[int]]] = {}
        self.asked: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """Each holder's asked (owner, kind) pairs: owner ids ascending (distinct), their kinds."""
        for c in members:
            held = r.neighbours[row_of[c]][r.flags[row_of[c]]]
            ids, kinds = ring[held], np.where(r.alive_at[held], m.SHARE_OF_SEED, m.SHARE_OF_MASK_KEY)
            order = np.argsort(ids)
            ids, kinds = ids[order], kinds[order]
            self.lists[c] = (ids[kinds == m.SHARE_OF_SEED].tolist(),
                             ids[kinds == m.SHARE_OF_MASK_KEY].tolist())
            self.asked[c] = ids, kinds
        self.hasher = ShareHasher(r.session, r.round_index)
        # The shares taken, one array entry each: owner's ring index, kind, x, the 33 share bytes.
        self.taken: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._committed: tuple[np.ndarray, np.ndarray] | None = None
        self._points: tuple[dict[int, tuple[int, int]], np.ndarray, np.ndarray] | None = None
        self.hashes: DeferredHashes | None = None
        """With worker processes: the answers whose share hashes are computed meanwhile."""

    def outgoing(self) -> dict[int, bytes]:
        r = self.r
        # Every survivor gets the same signatures and many the same attestations: packed once.
        bodies = UnmaskRequestBodies(sorted(r.signatures.items()), r.attestations)
        out = {}
        for c in self.members:
            alive, dropped = self.lists[c]
            attested = [v for v in alive if v not in r.signatures] if r.params.active else []
            out[c] = r.message(c, m.UnmaskRequest.KIND, bodies.body(alive, dropped, attested))
        return out

    def _commitments(self) -> tuple[np.ndarray, np.ndarray]:
        """Every owner's share hashes as one (owners, 2k, 32) byte array, and the row of each
        ring index (-1 for a client that shared nothing)."""
        if self._committed is None:
            r = self.r
            owners = sorted(r.commitments)
            rows = np.full(len(r.graph.ring), -1, dtype=np.int64)
            rows[r.graph.positions(np.array(owners, dtype=np.uint64))] = np.arange(len(owners))
            table = np.frombuffer(b"".join([r.commitments[o] for o in owners]), dtype=np.uint8)
            self._committed = table.reshape(len(owners), -1, COMMITMENT_BYTES), rows
        return self._committed

    def accept(self, sender: int, body: m.UnmaskShares) -> None:
        asked_owners, asked_kinds = self.asked[sender]
        owners, kind, points = body.owners, body.kinds, body.shares
        # Exactly the (owner, kind) pairs asked, each once: the asked owners are distinct, so the
        # answer sorted by owner must equal them pair by pair.
        order = np.argsort(owners, kind="stable")
        if (owners.size != asked_owners.size or not np.array_equal(owners[order], asked_owners)
                or not np.array_equal(kind[order], asked_kinds)):
            raise MalformedMessage("unmask response does not answer exactly what was asked")
        if not owners.size:
            self.answers[sender] = body
            return
        if _at_least_prime(points).any():
            raise MalformedMessage("a share is not a field element")
        self.answers[sender] = body
        r = self.r
        graph = r.graph
        at = graph.positions(owners)
        xs = graph.x_at(at, graph.position(sender))
        if r.workers > 1:  # hashed by the pool and the server meanwhile; checked at the stage's end
            if self.hashes is None:
                self.hashes = DeferredHashes(shared_pool(r.workers), session=r.session,
                                             round_index=r.round_index)
            self.hashes.add((sender, owners, at, kind, xs, points), (owners, xs, kind, points))
            return
        self._take(sender, owners, at, kind, xs, points, self.hasher.digest_rows(owners, xs, kind, points))

    def _take(self, sender: int, owners: np.ndarray, at: np.ndarray, kind: np.ndarray, xs: np.ndarray,
              points: np.ndarray, hashes: np.ndarray) -> None:
        """Keep the shares of ``sender``'s answer whose hash matches its owner's commitment; a share
        that does not is left out and its holder listed as misbehaving."""
        table, rows = self._commitments()
        committed = table[rows[at], (xs - 1) * m.SHARE_HASHES_PER_HOLDER + kind]
        good = (hashes == committed).all(axis=1)
        if not good.all():
            owner = int(owners[int(np.flatnonzero(~good)[-1])])
            self.r.misbehaved[sender] = f"a share of client {owner}'s secret does not match its commitment"
        self.taken.append((at[good], kind[good], xs[good], points[good]))

    def _take_all(self, answers: list[tuple[object, np.ndarray]]) -> None:
        """:meth:`_take` for every answer at once: (sender, owners, at, kinds, xs, points) and its
        hashes, in arrival order."""
        if not answers:
            return
        parts = [tag for tag, _ in answers]
        senders = np.repeat([p[0] for p in parts], [len(p[1]) for p in parts])
        owners, at, kind, xs, points = (np.concatenate([p[i] for p in parts]) for i in range(1, 6))
        hashes = np.concatenate([h for _, h in answers]).view(np.uint64)  # 32 bytes as 4 words
        table, rows = self._commitments()
        flat = rows[at] * table.shape[1] + (xs - 1) * m.SHARE_HASHES_PER_HOLDER + kind
        committed = np.take(table.reshape(-1, table.shape[2]).view(np.uint64), flat, axis=0)
        good = (hashes == committed).all(axis=1)
        for i in np.flatnonzero(~good).tolist():  # a holder's last bad share names the owner, as in _take
            self.r.misbehaved[int(senders[i])] = (f"a share of client {int(owners[i])}'s secret does not "
                                                  "match its commitment")
        self.taken.append((at[good], kind[good], xs[good], points[good]))

    def _group(self) -> tuple[dict[int, tuple[int, int]], np.ndarray, np.ndarray]:
        """The shares taken, sorted by (owner, kind, x) once: (owner ring index * 2 + kind) -> its
        slice, and the sorted x-coordinates and share bytes."""
        if self.hashes is not None:  # every answer's hashes, then the shares whose hash matched
            answers, self.hashes = self.hashes.finish(), None
            self._take_all(answers)
        if self._points is None:
            if self.taken:
                at, kinds, xs, values = (np.concatenate(part) for part in zip(*self.taken, strict=True))
            else:
                at = kinds = xs = np.empty(0, dtype=np.int64)
                values = np.empty((0, shamir.SHARE_BYTES), dtype=np.uint8)
            key = at * 2 + kinds
            order = np.lexsort((xs, key))
            key, xs, values = key[order], xs[order], values[order]
            bounds = np.flatnonzero(np.diff(key)) + 1
            starts = np.concatenate(([0], bounds)).astype(np.int64)
            ends = np.concatenate((bounds, [key.size])).astype(np.int64)
            slices = {} if not key.size else dict(zip(key[starts].tolist(), zip(
                starts.tolist(), ends.tolist(), strict=True), strict=True))
            self._points = slices, xs, values
            self.taken = []
        return self._points

    def _shares_of(self, owner: int, kind: int) -> tuple[tuple[int, ...], bytes]:
        """The t shares of ``owner``'s secret of ``kind`` with the smallest x-coordinates that
        answered: their x-coordinates and their bytes end to end; ProtocolAbort below t."""
        slices, xs, values = self._group()
        start, end = slices.get(self.r.graph.position(owner) * 2 + kind, (0, 0))
        if end - start < self.r.threshold:
            raise ProtocolAbort(f"unmask: {end - start} share(s) of client {owner}'s secret, "
                                f"threshold is {self.r.threshold}")
        end = start + self.r.threshold
        return tuple(xs[start:end].tolist()), values[start:end].tobytes()

    def _secret(self, owner: int, kind: int) -> bytes:
        xs, block = self._shares_of(owner, kind)
        try:
            size = shamir.SHARE_BYTES
            return shamir.combine_one(xs, [block[i:i + size] for i in range(0, len(block), size)])
        except SecAggError:
            raise ProtocolAbort(f"unmask: the shares of client {owner}'s secret do not rebuild a "
                                "32-byte secret") from None

    def _expand(self, masks: MaskSum) -> None:
        """Rebuild the secrets and derive every mask term (AES key, sign) to remove, handing each
        to ``masks`` as soon as it is known: the workers expand it while the next is derived."""
        r = self.r
        start = time.perf_counter()
        spent = 0.0  # rebuilding secrets
        for u in r.survivors:
            begin = time.perf_counter()
            seed = self._secret(u, m.SHARE_OF_SEED)
            spent += time.perf_counter() - begin
            masks.add(self_mask_key(seed, r.session, r.round_index, u), -1)
        for d in self.dropped:
            begin = time.perf_counter()
            try:
                recovered = crypto.KeyPair.from_private(self._secret(d, m.SHARE_OF_MASK_KEY))
            except CryptoError:
                recovered = None
            if recovered is None or recovered.public != r.keys[d].mask_key:
                raise ProtocolAbort(f"unmask: shares of client {d}'s mask key are inconsistent")
            spent += time.perf_counter() - begin
            for v in self.needs[d]:
                # v added +mask if v < d else -mask; remove exactly that.
                masks.add(mask_key(recovered, r.keys[v].mask_key, r.session, r.round_index, v, d),
                          -1 if v < d else +1)
        r.profile["secrets"] = spent
        r.profile["keys"] = time.perf_counter() - start - spent

    def _jobs(self) -> tuple[list[Job], ProtocolAbort | None]:
        """The unmask work as jobs in the single-process path's order (survivors' seeds, then the
        dropped clients' mask keys), up to the first secret with fewer than t shares, and that
        abort (None when every secret has t shares)."""
        r, jobs = self.r, []
        try:
            for u in r.survivors:
                jobs.append(SeedJob(u, *self._shares_of(u, m.SHARE_OF_SEED)))
            for d in self.dropped:
                partners = tuple((v, r.keys[v].mask_key, -1 if v < d else +1) for v in self.needs[d])
                jobs.append(KeyJob(d, *self._shares_of(d, m.SHARE_OF_MASK_KEY), r.keys[d].mask_key, partners))
        except ProtocolAbort as short:
            return jobs, short
        return jobs, None

    def _pooled(self, length: int) -> np.ndarray:
        """The masks to remove, computed by the server and its worker processes (same sum, same
        first abort as :meth:`_expand`)."""
        r = self.r
        start = time.perf_counter()
        self._group()  # the deferred share hashes checked (WorkerError if a worker failed)
        r.profile["hashes"] = time.perf_counter() - start
        jobs, short = self._jobs()
        r.profile["secrets"] = time.perf_counter() - start - r.profile["hashes"]  # the shares into jobs
        start = time.perf_counter()
        correction = shared_pool(r.workers).partial_sum(
            jobs, session=r.session, round_index=r.round_index, length=length,
            modulus_bits=r.encoder.modulus_bits, profile=r.profile)
        r.profile["keys"] = time.perf_counter() - start
        if short is not None:
            raise short
        return correction

    def close(self) -> None:
        r = self.r
        assert r.total is not None
        # Every secret of the sum is rebuilt before any mask is removed from the total: an abort
        # (too few or inconsistent shares) leaves the total untouched.
        if r.workers > 1:
            correction = self._pooled(r.total.size)
            start = time.perf_counter()
        else:
            with MaskSum(length=r.total.size, modulus_bits=r.encoder.modulus_bits) as masks:
                self._expand(masks)
                start = time.perf_counter()
                correction = masks.finish()
        np.add(r.total, correction, out=r.total)
        r.encoder.reduce(r.total)
        r.profile["masks"] = time.perf_counter() - start
        return None


class MaskedServer:
    """The server side of one round.

    Args:
        session: 16 random bytes naming the session.
        round_index: the round number (>= 0).
        graph: the ring and degree (:func:`protocols.masked.graph.shuffled_ring`).
        threshold: t, with degree // 2 < t <= degree.
        encoder: the shared fixed-point encoder (its bound must cover len(ring) clients).
        length: m, the update length (the weight and the clipped count travel as two more words).
        active: authenticated mode (default): signed keys, attestations and survivor list (needs
            ``directory``). False is the semi-honest opt-in.
        directory: long-term Ed25519 public keys of the clients, by id.
        corrupt: fraction of the population assumed to collude with the server, in [0, 1); the
            threshold must meet the clients' floor for it (:mod:`protocols.masked.policy`).
        population: the enrolled clients the corrupt fraction is taken of, >= the ring size. The
            server uses the larger of this and ``len(directory)``, as the clients do; required in
            semi-honest mode (no directory).
        workers: processes that compute the unmask stage (rebuilding secrets, key agreements,
            regenerating the masks), this one included, in [1, 64]. 1 (the default): this process
            alone. More: the work is dealt to the shared worker pool of that size
            (:mod:`protocols.masked.workers`, spawned on first use and reused by later rounds);
            the sum and every abort are the same bit for bit, and a worker that dies aborts the
            round with :class:`~protocols.masked.workers.WorkerError`.
    """

    def __init__(self, *, session: bytes, round_index: int, graph: RingGraph, threshold: int,
                 encoder: FixedPointEncoder, length: int, active: bool = True,
                 directory: Mapping[int, bytes] | None = None, corrupt: float = 0.1,
                 population: int | None = None, workers: int = 1) -> None:
        check_workers(workers)
        if len(session) != m.SESSION_BYTES:
            raise ValueError(f"session id must be {m.SESSION_BYTES} bytes")
        if not 0 <= corrupt < 1:
            raise ValueError(f"corrupt must be in [0, 1), got {corrupt}")
        if population is not None and (isinstance(population, bool) or not isinstance(population, int)
                                       or population < 1):
            raise ValueError(f"population must be an integer >= 1, got {population!r}")
        n = len(graph.ring)
        population = max(len(directory or {}) if active else 0, population or 0)
        if population < n:
            raise ValueError(f"population must be at least the ring size {n} (in semi-honest mode it "
                             f"must be given), got {population}")
        floor = minimum_threshold(n, graph.degree, corrupt, active=active, population=population)
        if not floor <= threshold <= graph.degree:
            raise ValueError(f"threshold must be in [{floor}, {graph.degree}] for {n} clients, degree "
                             f"{graph.degree}, corrupt fraction {corrupt} of a population of "
                             f"{population} ({'active' if active else 'semi-honest'} mode), got {threshold}")
        if encoder.max_clients < len(graph.ring) or encoder.max_length < length:
            raise ValueError("the encoder's max_clients or max_length is below this round's")
        if active and (directory is None or any(c not in directory for c in graph.ring)):
            raise ValueError("active mode needs every client's long-term public key")
        params = m.SessionParams(graph.ring, graph.degree, threshold, length, encoder.clip,
                                 encoder.bits, encoder.max_clients, encoder.max_weight,
                                 encoder.max_length, active, encoder.word_slack)
        self._round = _Round(session, round_index, graph, params, encoder, dict(directory or {}),
                             survivor_quorum(n, corrupt, population=population) if active else 0,
                             m.params_digest(params), workers=workers)
        self._stage: _Stage | None = _AdvertiseKeys(self._round, graph.ring)
        self.abort_reason: str | None = None

    @property
    def stage(self) -> str:
        if self.abort_reason is not None:
            return "aborted"
        return "done" if self._stage is None else self._stage.name

    @property
    def done(self) -> bool:
        return self._stage is None

    @property
    def members(self) -> tuple[int, ...]:
        """The clients the current stage is addressed to (those still in the round); empty when done."""
        return () if self._stage is None else self._stage.members

    @property
    def rejected(self) -> dict[int, str]:
        """Clients removed for a malformed or invalid message up to their masked input, with the
        reason (never in the sum)."""
        return dict(self._round.rejected)

    @property
    def misbehaved(self) -> dict[int, str]:
        """Clients that misbehaved without being removed: a repeated or late message; a malformed
        consistency signature or unmask answer after their masked input was in the total (they
        count as non-signers / non-answerers and stay in the sum); an unmask share that did not
        match its commitment (left out of the reconstruction)."""
        return dict(self._round.misbehaved)

    @property
    def profile(self) -> dict[str, float]:
        """Seconds of the unmask stage's close spent rebuilding secrets from shares (``secrets``),
        deriving the mask keys (``keys``: key agreement and HKDF; worker threads meanwhile expand
        the masks of the keys already derived) and expanding the masks still left once every key
        is derived, into the total (``masks``: AES-CTR and the additions, on every thread); empty
        before the round completes. With ``workers`` > 1: ``hashes`` is collecting the unmask
        answers' share hashes (computed meanwhile by the workers and this process) and checking
        them against the commitments, ``secrets`` gathering the shares into jobs, ``keys`` the
        whole parallel part (rebuilding, agreements, masks, in every process), of which
        ``own_slice`` this process computing jobs and ``wait`` waiting for the workers' last
        chunks, ``own_share`` the part of the jobs' cost this process computed (in [0, 1]), and
        ``masks`` adding the correction into the total."""
        return dict(self._round.profile)

    def outgoing(self) -> dict[int, bytes]:
        """Messages of the current stage, by recipient."""
        if self._stage is None:
            return {}
        return self._stage.outgoing()

    def receive(self, sender: int, data: bytes) -> None:
        """Take one client's answer. An invalid one removes the sender and is recorded."""
        if self._round.workers > 1:  # the pool's hand-off threads get the GIL within 0.1 ms
            with quick_switches():
                self._receive(sender, data)
            return
        self._receive(sender, data)

    def _receive(self, sender: int, data: bytes) -> None:
        stage = self._stage
        if sender in self._round.rejected or sender in self._round.ignored:
            return  # removed from the round, or spoiled an answer: nothing it sends is taken again
        if stage is None or sender not in stage.member_set or sender in stage.answers:
            # Ignored and recorded; a first, valid answer of this stage stays in force.
            if stage is not None and sender not in self._round.misbehaved:
                stage.repeats.add(sender)
            self._round.misbehaved.setdefault(sender, "unexpected or repeated message")
            return
        try:
            _, body = m.decode(data, expect=stage.expects, session=self._round.session,
                               round_index=self._round.round_index, sender=sender, recipient=m.SERVER)
            stage.accept(sender, body)
        except MalformedMessage as error:
            if stage.in_sum:  # its masked input is in the total: it cannot leave the sum
                self._round.misbehaved[sender] = f"{stage.name}: {error}"
                self._round.ignored.add(sender)
            else:
                self._round.rejected[sender] = str(error)
            return
        stage.answers.setdefault(sender, body)

    def close(self) -> None:
        """End the current stage. Raises ProtocolAbort when the round cannot complete."""
        if self._stage is None:
            raise ProtocolAbort("the round is already complete")
        try:
            if self._round.workers > 1:  # the pool's hand-off threads get the GIL within 0.1 ms
                with quick_switches():
                    self._stage = self._stage.close()
            else:
                self._stage = self._stage.close()
        except ProtocolAbort as abort:
            self._stage = None
            self.abort_reason = str(abort)
            raise

    def result(self) -> tuple[np.ndarray, tuple[int, ...]]:
        """The unmasked sum of the survivors' encoded inputs (mod 2^b) and the survivors."""
        if self.abort_reason is not None:
            raise ProtocolAbort(f"the round aborted: {self.abort_reason}")
        if self._stage is not None or self._round.total is None:
            raise ProtocolAbort("the round has not completed")
        return self._round.total, self._round.survivors
