"""Review r10: the Gaussian noise is truncated (Box-Muller from 53-bit uniforms).

FINDING, low (expected to FAIL today). ``SecureRandom.normal`` draws the radius as
sqrt(-2 ln u) with u >= 2^-53, so no sample ever exceeds R = sqrt(106 ln 2) = 8.5717 standard
deviations. The accountants price an untruncated Gaussian. With sensitivity Delta and noise
sigma Delta, an output beyond R sigma Delta from the neighbour's mean is impossible without the
record and likely with it when 1/sigma approaches R: the event has probability 0 under one run and
p under the other, so delta >= p at every epsilon. At sigma = 0.1 (accepted by the CLI and by
``fedsec.DP``; the ledger then claims a finite epsilon at delta = 1e-5) p is about 0.92 per round.
At sigma = 0.3 it is ~8e-8 per step, which exceeds delta = 1e-5 after ~130 unsampled steps.

(`test_the_noise_support_is_bounded` passes: it is the premise.) The audit below plays central client-level DP (``ClientLevelDP`` around ``PlainAggregation``,
the project's classes): one client whose clipped update is S e_0, or zero (its neighbour). It
checks the claimed (epsilon, delta) on the event "coordinate 0 of the released sum > R z S".
"""

import math

import numpy as np

from dp import Accountant, SecureRandom
from fl_core.aggregation import ClientUpdate, PlainAggregation
from protocols.privacy import ClientLevelDP

R = math.sqrt(-2 * math.log(2.0 ** -53))
Z, S, DELTA = 0.1, 1.0, 1e-5


def test_the_noise_support_is_bounded():
    draws = SecureRandom(b"\x01" * 32).normal(400_000)
    assert np.abs(draws).max() <= R


def test_the_claimed_epsilon_delta_holds_on_the_tail_event():
    layer = ClientLevelDP(PlainAggregation(), clip_norm=S, noise_multiplier=Z,
                          random=SecureRandom(b"\x02" * 32))
    eps = Accountant("pld").get_epsilon(DELTA, events=layer.round_events(4))
    threshold = R * Z * S
    trials = 300
    hits = 0
    for _ in range(trials):
        update = np.zeros(4, np.float32)
        update[0] = 5.0  # clipped to S e_0
        released = layer.aggregate(1, [ClientUpdate(0, update, 1.0)]).weighted_sum
        hits += released[0] > threshold
    p_with = hits / trials
    p_without = 0.0  # the zero-update neighbour: |noise| <= R z S always (test above)
    assert p_with <= math.exp(eps) * p_without + DELTA, (
        f"claimed ({eps:.1f}, {DELTA}) at z = {Z}: the tail event has probability {p_with:.2f} "
        f"with the record and 0 without it")
