"""Adversary: the coordinator alone (no colluding site, no crash needed: it only *says* it resumed).

Claim attacked (docs/deployment.md "Resume", :mod:`fedsec.network.site_state`): "a site may train
round r again iff its round-r update was never consumed ... nothing that depends on the first
training has left the site". Something does leave at every training: the train job's answer,
``ok`` or ``{"ok": false, "reason": "nonfinite"}`` (``Site._jobs`` returns ``ClientAbort.reason``
to the coordinator). Whether local training on the site's records turns non-finite is a
function of those records and of the model the coordinator sends, so every training is one bit
about the data, and the retrain rule gives the coordinator as many trainings of round 1 as it
asks for, none of them consumed, none charged beyond the one reserved round.

The crafted logistic model: weight w0 = 3e38 / T on feature 0 and w1 = -3e38 on feature 1 (every
record's feature 1 is > 1.2, so its term is -inf in float32). A record whose feature 0 exceeds
about 1.134 T makes its logit +inf + -inf = NaN, its DP-SGD gradient NaN, and the site answers
``nonfinite``; otherwise the logit is -inf and training is finite. Poisson sampling hides some
records from one training, so each threshold is asked 8 times; a bisection then reads the
site's largest feature-0 value (a raw clinical measurement, to 4 digits) in ~200 trainings of
the one round 1. A DP-SGD site promised (example-level) epsilon 3 for the plan.

Each training below follows ``Site._jobs`` for a train job: ``SiteState.contribute`` (the durable
retrain rule), then ``SiteWork.train``. The secure outcome is a refusal from the retrain rule
(``PolicyRefused``) before the bisection converges, or an answer that does not depend on the data.
"""

from __future__ import annotations

import numpy as np
from fedsec.protocols.errors import ClientAbort

from fedsec.network.envelope import vector_bytes
from fedsec.network.errors import PolicyRefused
from tests.review.harness import Ring

FLOAT32_MAX = float(np.finfo(np.float32).max)


def test_unbounded_retraining_of_one_round_reads_a_feature_maximum(tmp_path):
    ring = Ring(tmp_path / "d", 3, extra='[dp]\naccountant = "rdp"\n')
    try:
        site = ring.sites[0]
        site.work.start(noise_multiplier=5.0)  # far above what epsilon 3 over 3 rounds needs
        state, run, length = site.context.sessions, "plan-sha", site.work.length
        x = site.work.train_data.x
        assert x[:, 1].min() > 1.2

        def train(vector: np.ndarray) -> bool:
            """One train job of round 1 as ``Site._jobs`` runs it; True iff it answers nonfinite."""
            state.contribute(run, 1, max_rounds=ring.config.rounds)
            header = {"round": 1, "rng": np.random.default_rng().bit_generator.state}
            try:
                ring.job(0, "train", header, vector_bytes(vector))
            except ClientAbort as abort:
                assert abort.reason == "nonfinite"
                return True
            return False

        assert not train(np.zeros(length, dtype=np.float32))  # an honest round-1 job first

        def over(threshold: float) -> bool:
            crafted = np.zeros(length, dtype=np.float32)
            crafted[0], crafted[1] = np.float32(3e38 / threshold), np.float32(-3e38)
            return any(train(crafted) for _ in range(8))

        low, high = 1.0, 1000.0
        try:
            for _ in range(25):
                middle = (low * high) ** 0.5
                low, high = (middle, high) if over(middle) else (low, middle)
        except PolicyRefused:  # the site stopped the retraining: the secure outcome
            return
        recovered = low * FLOAT32_MAX / 3e38
        # secure outcome: the coordinator does not learn this site's largest feature-0 value
        assert not np.isclose(recovered, float(x[:, 0].max()), rtol=1e-3)
    finally:
        ring.close()
