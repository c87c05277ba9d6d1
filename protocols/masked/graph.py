"""The masking graph: clients on a ring shuffled with a CSPRNG, each linked to its k nearest.

``degree = n - 1`` is the complete graph of SecAgg (Bonawitz et al. 2017); an even
``degree < n - 1`` is the Harary graph H(k, n) of SecAgg+ (Bell et al. 2020): client u is linked to
the k/2 clients on either side of it on the ring. Clients mask with, and share their secrets
among, their neighbours only.

Shares carry small x-coordinates: the holder at ring offset o = pos(v) - pos(u) (mod n) from the
owner u gets x = o for o <= k/2 and x = o - n + k + 1 for the k/2 on the other side, so every
owner's x-coordinates are 1..k, and reconstructing from the smallest answering ones keeps the
Lagrange coefficients cheap (see :mod:`secagg.shamir`).

The (degree, threshold) rule, :func:`choose_parameters`, for n clients of which at most a
fraction ``dropout`` drop out and a fraction ``corrupt`` collude with the server, with failure
probabilities 2^-eta (correctness) and 2^-sigma (security), union-bounded over the n clients.
With a random ring, the numbers of corrupt (C) and dropped (D) neighbours of a client are
hypergeometric (k draws from the other n - 1 clients). Let c and d be their (1 - 2^-x / n) quantiles.
Then the threshold is t = max(floor(k/2) + 1, c + 1), so the corrupt neighbours alone can never
reconstruct a secret and no two disjoint honest groups both can; in active mode
t = floor((k + c) / 2) + 1, so even a server that shows honest clients different survivor lists
cannot collect t shares of both secrets of one client. The degree is the smallest even k with
k - d >= t (enough survivors to unmask everyone); if none below n - 1 works, the graph is complete.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from fedsec.secagg.errors import InvalidArgumentError
from scipy.stats import hypergeom

DEFAULT_SIGMA = 40
DEFAULT_ETA = 20


@dataclass(frozen=True)
class RingGraph:
    """Clients in ring order and the degree k (n - 1 = complete).

    Nothing here is built for every member: membership and ring positions come from one sorted
    copy of the ids (two numpy arrays, 16 bytes a member), and a member's neighbours and the
    x-coordinates of its share holders are computed arithmetically from its position when first
    asked for, then kept (k entries per member asked about). A client therefore holds memory
    linear in the ring it was sent plus its own neighbourhood; its work is one sort of the ring
    (O(n log n), vectorised) and then its own neighbourhood only.
    """

    ring: tuple[int, ...]
    degree: int

    def __post_init__(self) -> None:
        n = len(self.ring)
        if n < 2:
            raise InvalidArgumentError("a masking graph needs at least 2 clients")
        if not (self.degree == n - 1 or (self.degree % 2 == 0 and 2 <= self.degree < n - 1)):
            raise InvalidArgumentError(
                f"degree must be n - 1 = {n - 1} (complete) or even in [2, {n - 2}], got {self.degree}")
        kinds = set(map(type, self.ring))
        if not kinds <= {int} and any(isinstance(c, bool) or not isinstance(c, int | np.integer)
                                      for c in self.ring):
            raise InvalidArgumentError("client ids must be integers")
        try:
            ids = np.array(self.ring, dtype=np.uint64)
        except (OverflowError, ValueError, TypeError):
            raise InvalidArgumentError("client ids must be integers in [0, 2^64)") from None
        order = np.argsort(ids, kind="stable")
        ordered = ids[order]
        if n > 1 and bool((ordered[1:] == ordered[:-1]).any()):
            raise InvalidArgumentError("the ring lists a client twice")
        object.__setattr__(self, "_ids", ordered)
        object.__setattr__(self, "_slots", order)
        object.__setattr__(self, "_by_owner", {})

    @cached_property
    def complete(self) -> bool:
        return self.degree == len(self.ring) - 1

    def position(self, client: int) -> int:
        """Index of ``client`` in the ring, or -1 if it is not a member (O(log n))."""
        if isinstance(client, bool) or not isinstance(client, int | np.integer) or not 0 <= client < 2**64:
            return -1
        key = np.uint64(client)
        i = int(np.searchsorted(self._ids, key))
        if i < self._ids.size and self._ids[i] == key:
            return int(self._slots[i])
        return -1

    def __contains__(self, client: int) -> bool:
        return self.position(client) >= 0

    def _holders(self, owner: int) -> tuple[tuple[int, ...], dict[int, int]] | None:
        """``owner``'s neighbours in x order and mapped to their x-coordinates (None for a
        stranger), computed from its ring position on first use and kept."""
        found = self._by_owner.get(owner)
        if found is None:
            p = self.position(owner)
            if p < 0:
                return None
            n, half = len(self.ring), self.degree // 2
            if self.complete:
                ordered = tuple(self.ring[p + 1:]) + tuple(self.ring[:p])
            else:
                ordered = tuple(self.ring[(p + o) % n] for o in (*range(1, half + 1), *range(-half, 0)))
            found = self._by_owner[owner] = (ordered, {v: x for x, v in enumerate(ordered, start=1)})
        return found

    def x_of(self, owner: int, holder: int) -> int:
        """x-coordinate (1..k) of ``holder``'s share of ``owner``'s secrets; 0 if not neighbours
        (or either is not a member)."""
        found = self._holders(owner)
        return 0 if found is None else found[1].get(holder, 0)

    def neighbours(self, client: int) -> tuple[int, ...]:
        """The k neighbours of ``client``, ordered by their x-coordinate (KeyError for a stranger)."""
        found = self._holders(client)
        if found is None:
            raise KeyError(client)
        return found[0]

    def is_neighbour(self, u: int, v: int) -> bool:
        return self.x_of(u, v) != 0

    def positions(self, clients: np.ndarray) -> np.ndarray:
        """Ring index of each id in ``clients`` (an integer array), -1 for a non-member (vectorised
        :meth:`position`; int64 array of the same shape)."""
        ids = np.asarray(clients)
        if ids.size == 0:
            return np.empty(ids.shape, dtype=np.int64)
        if ids.dtype.kind not in "iu":
            raise InvalidArgumentError("client ids must be an integer array")
        valid = ids >= 0 if ids.dtype.kind == "i" else np.ones(ids.shape, dtype=bool)
        keys = np.where(valid, ids, 0).astype(np.uint64)
        i = np.minimum(np.searchsorted(self._ids, keys), self._ids.size - 1)
        found = valid & (self._ids[i] == keys)
        return np.where(found, self._slots[i], -1).astype(np.int64)

    def neighbour_positions(self, positions: np.ndarray) -> np.ndarray:
        """Ring indices of the neighbours of the clients at ``positions`` (ring indices), one row
        each, ordered by x-coordinate (vectorised :meth:`neighbours`): shape (len, k), int64.
        Column x - 1 of a client's row holds the neighbour at x; that neighbour sees the client
        at x' = k + 1 - x."""
        n, k = len(self.ring), self.degree
        x = np.arange(1, k + 1, dtype=np.int64)
        offsets = x if self.complete else np.where(x <= k // 2, x, x - k - 1)
        return (np.asarray(positions, dtype=np.int64).reshape(-1, 1) + offsets) % n

    def x_at(self, owner: np.ndarray, holder: np.ndarray) -> np.ndarray:
        """x-coordinate (1..k) of the holder's share of the owner's secrets, by ring index
        (vectorised :meth:`x_of`: ``owner`` and ``holder`` are arrays of ring indices in [0, n),
        broadcast together); 0 where they are not neighbours."""
        n, k = len(self.ring), self.degree
        offset = (np.asarray(holder, dtype=np.int64) - np.asarray(owner, dtype=np.int64)) % n
        if self.complete:
            return offset
        half = k // 2
        return np.where(offset <= half, offset, np.where(offset >= n - half, offset - n + k + 1, 0))


def shuffled_ring(clients: list[int] | tuple[int, ...],
                  rng: np.random.Generator | None = None) -> tuple[int, ...]:
    """The clients in an order drawn with the OS CSPRNG (the server cannot be steered by a seed).

    ``rng`` (reproducible experiments only: whoever knows its seed knows the ring) draws the order
    from a seeded generator instead.
    """
    order = list(clients)
    if rng is not None:
        return tuple(order[i] for i in rng.permutation(len(order)))
    secrets.SystemRandom().shuffle(order)
    return tuple(order)


@lru_cache(maxsize=4096)
def _quantile(n_others: int, bad: int, draws: int, exponent: float) -> int:
    """Smallest c with P[Hypergeom(n_others, bad, draws) > c] <= 2^-exponent. Cached: a pure
    function of its arguments, and scipy's survival function cost about 1 ms a call, twice for
    every aggregation a masking coordinator opens (on a deployed round's critical path)."""
    if bad <= 0:
        return 0
    dist = hypergeom(n_others, bad, draws)
    bound = 2.0 ** -exponent
    for c in range(min(bad, draws) + 1):
        if dist.sf(c) <= bound:
            return c
    return min(bad, draws)


def threshold_for(k: int, corrupt_neighbours: int, *, active: bool) -> int:
    """t for degree k given the bound on corrupt neighbours (see the module docstring)."""
    if active:
        return (k + corrupt_neighbours) // 2 + 1
    return max(k // 2 + 1, corrupt_neighbours + 1)


@dataclass(frozen=True)
class GraphParameters:
    degree: int
    threshold: int
    corrupt_bound: int
    dropout_bound: int


def choose_parameters(
    n: int, *, dropout: float, corrupt: float, graph: str = "harary", active: bool = False,
    population: int | None = None, sigma: float = DEFAULT_SIGMA, eta: float = DEFAULT_ETA,
) -> GraphParameters:
    """Degree and threshold for n clients (module docstring); ``graph='complete'`` fixes k = n - 1.

    Args:
        n: clients in the round, >= 2.
        dropout: tolerated dropout fraction, in [0, 1).
        corrupt: tolerated fraction of clients colluding with the server, in [0, 1).
        graph: ``harary`` (smallest sufficient k) or ``complete``.
        active: threshold for a server that deviates from the protocol.
        population: the clients the corrupt fraction is taken of (default n): the ring holds at most
            min(floor(corrupt * population), n - 1) corrupt clients
            (:func:`protocols.masked.policy.corrupt_count`).
        sigma, eta: security and correctness parameters in bits, > 0.
    """
    if n < 2:
        raise InvalidArgumentError(f"need at least 2 clients, got {n}")
    if not (0 <= dropout < 1 and 0 <= corrupt < 1):
        raise InvalidArgumentError(f"dropout and corrupt must be in [0, 1), got {dropout}, {corrupt}")
    if graph not in ("harary", "complete"):
        raise InvalidArgumentError(f"graph must be 'harary' or 'complete', got {graph!r}")
    others = n - 1
    if population is not None and (isinstance(population, bool) or not isinstance(population, int)
                                   or population < 1):
        raise InvalidArgumentError(f"population must be an integer >= 1, got {population!r}")
    bad_c = min(math.floor(corrupt * (n if population is None else population)), n - 1)
    bad_d = math.ceil(dropout * n)
    union = math.log2(n)
    candidates = [] if graph == "complete" else list(range(2, n - 1, 2))
    for k in candidates + [n - 1]:
        c = _quantile(others, bad_c, k, sigma + union)
        d = _quantile(others, bad_d, k, eta + union)
        t = threshold_for(k, c, active=active)
        if k - d >= t or k == n - 1:
            return GraphParameters(k, min(t, k), c, d)
    raise AssertionError("unreachable: the complete graph is always a candidate")
