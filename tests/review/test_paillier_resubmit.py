"""Adversary: the coordinator alone, under Paillier with a key holder (custody ``key_holder``).

Claim attacked (docs/deployment.md threat model, "difference one site out": "a contribution goes
into at most one aggregation, ever: the first setup naming it consumes it"). The rule counts
*setups*; one setup builds one :class:`~fedsec.network.layers.paillier.KeyHolderSite`, and that
layer answers every ``paillier/submit`` stage message it is sent: ``KeyHolderSite.handle`` encrypts
the same contribution again for any new ``RoundSpec`` whose sequence number is above the last
(``PaillierClient.submit`` refuses only a number it already used). So with ONE setup per site, the
coordinator asks each site for two submissions of its one contribution, under sequence numbers s
and s + 1; the key holder decrypts the sum of all four under s (the ordinary round) and the sum of
the three others under s + 1 (>= its threshold of 3 submissions, a fresh number): the difference is
the victim's weighted update. No restart, no new session, no colluding site.

The sites are the project's ``PaillierSite`` layers built as ``Site._jobs`` builds them (the
fixtures of ``tests/fedsec/network/test_deploy_paillier_layer.py``); the key holder is the real
:class:`KeyHolderService` behind mTLS. The adversary runs the project's own coordinator layer for
the first sum and its own ``PaillierServer`` for the second.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.encoding import encoder_for, remove_offsets
from fedsec.protocols.paillier import PaillierServer
from fedsec.protocols.wire import Writer

from fedsec.network.layers import LAYERS
from fedsec.network.layers.paillier import SUBMIT, round_spec
from tests.fedsec.network.conftest import study  # noqa: F401 - fixture
from tests.fedsec.network.test_deploy_paillier_layer import (  # noqa: F401 - fixtures
    LENGTH,
    MAX_WEIGHT,
    Sites,
    coordinator_context,
    fresh_site_memory,
    inputs,
    keyholder,
    plan,
    sites,
)
from tests.review.harness import REFUSALS


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="R6: one Paillier setup answers any number of submit stages, so one "
                                       "contribution is encrypted under two sequence numbers and summed "
                                       "twice (differencing without a second setup)")
def test_one_setup_does_not_yield_two_submissions_of_one_contribution(study, sites, keyholder, tmp_path):  # noqa: F811
    address, _ = keyholder
    base = plan("key_holder", address)
    config = dataclasses.replace(base, dp=dataclasses.replace(base.dp, reproducible=False))
    vectors, weights = inputs(1)
    side = Sites(study, config, sites, vectors, weights, tmp_path / "sites")
    context = coordinator_context(study, config, side, 7)
    coordinator = LAYERS["paillier"][0](context)
    zeros = np.zeros(LENGTH, np.float32)
    everyone = coordinator.aggregate(1, [ClientUpdate(c, zeros, 1) for c in range(4)], purpose="update")
    assert set(everyone.participants) == {0, 1, 2, 3}

    custody = coordinator.custody
    s = config.secure
    encoder = encoder_for("update", clients=4, length=LENGTH, max_weight=MAX_WEIGHT, clip=s.clip, bits=s.bits)
    spec = round_spec(sequence=custody._sequence + 1, length=LENGTH, clients=4,
                      word_bound=encoder.word_bound, tagged=True)
    others = (1, 2, 3)
    submissions = {}
    for c in others:  # the same layer objects: no new setup, so no contribution is consumed again
        try:
            message = Writer().blob(b"").blob(spec.to_bytes()).getvalue()
            submissions[c] = side.layers[c].handle(SUBMIT, message)
        except REFUSALS:  # a refused second submission is the secure outcome
            return
    server = PaillierServer(custody._public_key, spec, expected=list(others), threshold=custody.threshold,
                            identities={c: context.peers[context.names[c]].identity_key.public_bytes_raw()
                                        for c in others},
                            identity=context.identity)
    for c in others:
        server.receive(c, submissions[c])
    try:
        words = server.finish(custody._decrypt(server.decryption_request()))
    except REFUSALS:  # the key holder refusing the second sum is the secure outcome
        return
    weighted, total_weight, _ = encoder.decode(remove_offsets(words[:-1], int(words[-1]), None))
    assert total_weight == sum(weights[c] for c in others)
    recovered = (everyone.weighted_sum - weighted) / weights[0]
    # secure outcome: the coordinator cannot read site 0's own update
    assert not np.allclose(recovered, np.clip(vectors[0], -s.clip, s.clip), atol=1e-3)
