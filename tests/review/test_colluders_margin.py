"""Adversary: the coordinator with the c colluding sites the masking layer tolerates (c = 2 of a
roster of 20 at ``secure.corrupt = 0.1``), choosing which honest sites "drop out".

Claim attacked (docs/privacy.md section 4, relied on by docs/deployment.md "Client-level DP
deployed": "its noise protects a site ... against colluding sites only by the simulation's
measured margin"): "a searching dropout adversary at the lowest threshold the clients accept never
got a sum released with fewer than t + c contributions, so the coalition still faced >= mu". The
measurement behind it (``tests/protocols/test_client_level_noise_against_colluders.py``) draws
*random* dropouts at n = 10 (c = 1, where t + 1 >= t + c always). A coordinator that picks its
dropouts reaches the floor the honest clients enforce: max(quorum, t + 1) survivors. At n = 20 the
deployed masking layer runs t = 11 with quorum 12; the coordinator withholds the masked-input
stage from 8 sites (dropouts, as a stage deadline would make them) and the ring unmasks the sum of
12 contributions. Two are the colluders', whose Skellam shares (mu / 11 each) they know: the honest
noise in that released sum is (12 - 2) / 11 mu = 0.91 mu, below the mu the ledger charges.

The sites are the project's unmodified ``SiteWork`` + ``MaskingSite`` (``tests.review.harness``),
the coordinator the project's ``MaskingCoordinator``; the sum here is of evaluation sums (the
masked protocol and its survivor rules are the same for an update).
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.fl_core.federated_eval import sums_length
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked.policy import corrupt_count

from fedsec.network.envelope import vector_bytes
from tests.review.harness import REFUSALS, Ring

N, DROPPED = 20, range(12, 20)


@pytest.mark.slow
@pytest.mark.xfail(strict=True,
                   reason="S4-7 (open, documented in docs/privacy.md section 4): a coordinator choosing "
                          "dropouts gets a masked sum of max(q, t+1) = 12 < t+c = 13 contributions at "
                          "n = 20; shares of mu / (t - c) are not implemented")
def test_chosen_dropouts_never_release_fewer_than_t_plus_c_contributions(tmp_path):
    ring = Ring(tmp_path / "d", N)
    try:
        c = corrupt_count(N, ring.config.secure.corrupt, population=N)
        model = np.zeros(ring.sites[0].work.length, dtype=np.float32)
        for k in range(N):
            ring.job(k, "evaluate", {"round": 1}, vector_bytes(model))
        deliver = ring.layer_message

        def withhold(k: int, stage: str, body: bytes) -> bytes | None:
            if k in DROPPED and stage == "masked input":  # the coordinator never delivers it
                raise ClientAbort("no answer before the stage deadline")
            return deliver(k, stage, body)

        ring.layer_message = withhold  # type: ignore[method-assign]
        try:
            result = ring.aggregate(list(range(N)), purpose="statistics", round_index=1,
                                    length=sums_length(2))
        except REFUSALS:  # refusing to unmask is the secure outcome
            return
        t = int(result.metrics["secagg_threshold"])
        # secure outcome (the documented margin): a released sum holds >= t + c contributions
        assert len(result.participants) >= t + c, (len(result.participants), t, c)
    finally:
        ring.close()
