"""The floors an honest client insists on: the smallest threshold and survivor quorum it accepts.

Both sides compute them with these functions, so the server's configuration check and every
client agree. The adversary they are derived for is the server together with at most ``c`` of
the ``n`` clients of the ring (``c = floor(corrupt * n)``), where ``corrupt`` is the fraction the
client's :class:`protocols.masked.client.ClientPolicy` assumes.

* ``c_k``: corrupt clients among one client's k neighbours. On the complete graph this is ``c``
  (capped at k); on the Harary graph of SecAgg+ it is the hypergeometric (1 - 2^-sigma / n)
  quantile of :mod:`protocols.masked.graph` (the ring is shuffled with a CSPRNG).
* threshold floor: active (authenticated) mode ``t > (k + c_k) / 2``; semi-honest mode
  ``t > max(k / 2, c_k)``. Always ``c_k < t <= k``.
* survivor quorum (active mode): signatures over one survivor list from ``q > (n + c) / 2`` ring
  members. Each honest client signs at most one list per round, so two different lists can never
  both reach ``q`` signatures (the honest signers of both would number more than ``n - c``).
"""

from __future__ import annotations

import math

from protocols.masked.graph import DEFAULT_SIGMA, _quantile, threshold_for


def corrupt_count(n: int, corrupt: float) -> int:
    """c: corrupt clients in a ring of n (floor(corrupt * n), at most n - 1)."""
    return min(math.floor(corrupt * n), n - 1)


def corrupt_neighbours(n: int, k: int, corrupt: float, *, sigma: float = DEFAULT_SIGMA) -> int:
    """c_k: the bound on corrupt clients among one client's k neighbours (module docstring)."""
    bad = corrupt_count(n, corrupt)
    if k >= n - 1:
        return min(bad, k)
    return _quantile(n - 1, bad, k, sigma + math.log2(n))


def minimum_threshold(n: int, k: int, corrupt: float, *, active: bool, sigma: float = DEFAULT_SIGMA) -> int:
    """The smallest t an honest client accepts for ring size n and degree k.

    Returns a value above k when no threshold is safe (the client then refuses the session).
    """
    c_k = corrupt_neighbours(n, k, corrupt, sigma=sigma)
    return max(threshold_for(k, c_k, active=active), c_k + 1, 2)


def survivor_quorum(n: int, corrupt: float) -> int:
    """q = floor((n + c) / 2) + 1: signatures on one survivor list needed before anything is revealed."""
    return (n + corrupt_count(n, corrupt)) // 2 + 1
