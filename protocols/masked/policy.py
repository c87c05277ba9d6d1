"""The floors an honest client insists on: the smallest threshold and survivor quorum it accepts.

Both sides compute them with these functions, so the server's configuration check, the
aggregation layer and every client agree. The adversary they are derived for is the server
together with at most ``c_pop = floor(corrupt * population)`` clients of the whole population
(the enrolled identities a client knows: its directory of long-term keys, or the size its policy
is told in semi-honest mode), where ``corrupt`` is the fraction the client's
:class:`protocols.masked.client.ClientPolicy` assumes.

The bound comes from the population, never from the ring the server sends: the server chooses
the ring (which clients, how many), so a ring of the victim, the colluders and one honest client
must not make ``c`` shrink. In a ring of n members at most ``c = min(c_pop, n - 1)`` are corrupt
(the client computing the bound is itself honest and in the ring).

* ``c_k``: corrupt clients among one client's k neighbours. On the complete graph this is ``c``
  (capped at k); on the Harary graph of SecAgg+ it is the hypergeometric (1 - 2^-sigma / n)
  quantile for k draws from the n - 1 others of which ``c`` are corrupt (the ring is shuffled with
  a CSPRNG; see "Not protected" in docs/secure-aggregation.md for a server that does not).
* threshold floor: active (authenticated) mode ``t > (k + c_k) / 2``; semi-honest mode
  ``t > max(k / 2, c_k)``. Always ``c_k < t <= k``.
* survivor quorum (active mode): signatures over one survivor list from ``q > (n + c) / 2`` ring
  members. Each honest client signs at most one list per round, so two different lists can never
  both reach ``q`` signatures (the honest signers of both would number more than ``n - c``).
"""

from __future__ import annotations

import math

from fedsec.protocols.masked.graph import DEFAULT_SIGMA, _quantile, threshold_for


def _check(n: int, population: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n (the ring size) must be an integer >= 2, got {n!r}")
    if isinstance(population, bool) or not isinstance(population, int) or population < 1:
        raise ValueError(f"population must be an integer >= 1, got {population!r}")


def population_corrupt(population: int, corrupt: float) -> int:
    """c_pop = floor(corrupt * population): corrupt clients in the whole population."""
    return math.floor(corrupt * population)


def corrupt_count(n: int, corrupt: float, *, population: int) -> int:
    """c: corrupt clients in a ring of n drawn from ``population``: min(c_pop, n - 1)."""
    _check(n, population)
    return min(population_corrupt(population, corrupt), n - 1)


def corrupt_neighbours(n: int, k: int, corrupt: float, *, population: int,
                       sigma: float = DEFAULT_SIGMA) -> int:
    """c_k: the bound on corrupt clients among one client's k neighbours (module docstring)."""
    bad = corrupt_count(n, corrupt, population=population)
    if k >= n - 1:
        return min(bad, k)
    return _quantile(n - 1, bad, k, sigma + math.log2(n))


def minimum_threshold(n: int, k: int, corrupt: float, *, active: bool, population: int,
                      sigma: float = DEFAULT_SIGMA) -> int:
    """The smallest t an honest client accepts for ring size n, degree k and ``population``.

    Returns a value above k when no threshold is safe (the client then refuses the session).
    """
    c_k = corrupt_neighbours(n, k, corrupt, population=population, sigma=sigma)
    return max(threshold_for(k, c_k, active=active), c_k + 1, 2)


def survivor_quorum(n: int, corrupt: float, *, population: int) -> int:
    """q = floor((n + c) / 2) + 1: signatures on one survivor list needed before anything is revealed."""
    return (n + corrupt_count(n, corrupt, population=population)) // 2 + 1
