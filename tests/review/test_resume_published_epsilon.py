"""Adversary: a coordinator that dies (kill -9, or pretends to) after the sites answered a round's
unmask stage and before that round's checkpoint; it resumes (``fedsec serve --resume``). It then
held everything that round's sum needs; the sites count the round as released, and so does the
coordinator's own per-site ledger. Low: the sites' ledgers are right; the study's published
figure is not.

Claim attacked (issue 14: "epsilon continues from the ledger: it never resets"; docs/deployment.md
"Resume": the coordinator charges a replayed round). The dead incarnation could release round 2's
sum (the crash falls after the update's unmask stage). The resumed one re-runs round 2; every site
refuses it (``rounds.replayed``: its update went into the dead coordinator's sum), the coordinator
charges each site's own ledger row for it, but the run's ledger (``summary.json`` ``privacy.epsilon``
and ``history.csv``, what the study publishes) is restored from round 1's checkpoint and never
charged round 2: it reports two releases' epsilon for a run that released three sums.

The federation is ``tests/fedsec/network/resume_harness.py``'s (the project's coordinator and four
unmodified in-process sites; the crash point ``(round 2, exchange 9 = layer/unmask, after)``).
"""

from __future__ import annotations

import pytest

from tests.fedsec.network.resume_harness import Federation
from tests.fedsec.network.test_resume_crash_search import EXTRA, ROUND

UNMASK = ROUND.index("layer/unmask") + 1
"""The 1-based exchange of the update's last masking stage (its sum is released after it)."""


@pytest.mark.slow
def test_a_round_released_before_a_crash_is_in_the_published_epsilon(tmp_path):
    reference = Federation(tmp_path / "reference", rounds=3, extra=EXTRA)
    try:
        expected = reference.coordinator()["privacy"]["epsilon"]
    finally:
        reference.close()
    federation = Federation(tmp_path / "crashed", rounds=3, extra=EXTRA)
    try:
        assert federation.coordinator(crash=(2, UNMASK, True)) is None
        summary = federation.coordinator(resume=True)
        assert summary is not None
        for site in federation.sites.values():  # three sums released with each site's update
            assert site.state.contributed(site.sha) == [1, 2, 3]
        # secure outcome: the published epsilon counts every released sum (the uninterrupted run's)
        assert summary["privacy"]["epsilon"] >= expected * (1 - 1e-9)
    finally:
        federation.close()
