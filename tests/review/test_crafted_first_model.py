"""Adversary: the coordinator alone. Claim attacked (issue 13, common rules): "bad input gets a clear
typed error and loses nothing"; ``Site._jobs`` turns a job's ``ClientAbort``, ``PolicyRefused``,
``ValueError`` or ``ArithmeticError`` into a refusal answer and goes on.

A site's first DP-SGD training probes the model (``dp.per_sample``'s independence check on the
first batch). A crafted global model whose logits are NaN on the site's records (a weight of
3e38 on feature 0 and -3e38 on feature 1: +inf + -inf) makes that check call ``torch.allclose``
with a NaN tolerance, which raises ``RuntimeError``: not caught by ``Site._jobs``, so the site
process dies with a traceback (exit 1) on a job the coordinator chose. Whether it dies depends on
the site's records (some record must overflow), so each crash is also one bit about the data.
"""

from __future__ import annotations

import numpy as np
from fedsec.protocols.errors import ClientAbort

from fedsec.network.envelope import MalformedEnvelope, vector_bytes
from fedsec.network.errors import PolicyRefused
from tests.review.harness import Ring

HANDLED = (ClientAbort, PolicyRefused, MalformedEnvelope, ValueError, ArithmeticError)
"""What ``Site._jobs`` answers as a refusal (anything else ends the site process)."""


def test_a_crafted_first_model_is_refused_not_fatal(tmp_path):
    ring = Ring(tmp_path / "d", 3, extra='[dp]\naccountant = "rdp"\n')
    try:
        site = ring.sites[0]
        site.work.start(noise_multiplier=5.0)
        site.context.sessions.contribute("plan-sha", 1, max_rounds=ring.config.rounds)
        crafted = np.zeros(site.work.length, dtype=np.float32)
        crafted[0], crafted[1] = np.float32(3e38 / 10.0), np.float32(-3e38)
        header = {"round": 1, "rng": np.random.default_rng(0).bit_generator.state}
        try:
            ring.job(0, "train", header, vector_bytes(crafted))
        except HANDLED:
            pass  # a refusal answer: the secure outcome
    finally:
        ring.close()
