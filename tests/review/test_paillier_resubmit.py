"""Adversary: the coordinator alone, under Paillier (custody ``key_holder``, and ``threshold`` below).

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
the first sum and its own ``PaillierServer`` for the second. Under threshold custody the second sum
is the project's coordinator layer again, its first messages stripped of their setups (each site
then answers with the layer it holds); the victim is asked for no submission but still endorses.
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


def _without_setups(forward):
    """The adversary's exchange: every first message loses its setup, so each site answers the stage
    with the layer it already holds (``Site._jobs`` builds a new layer only for a message that starts
    with a setup) and no contribution is consumed again."""
    from fedsec.network import envelope
    from fedsec.network.layers import split_first

    def exchange(stage, outgoing):
        stripped = {c: split_first(m)[1] if m[:len(envelope.MAGIC)] == envelope.MAGIC else m
                    for c, m in outgoing.items()}
        return forward(stage, stripped)

    return exchange


@pytest.mark.slow
def test_threshold_custody_one_setup_does_not_yield_two_sums(study, sites, tmp_path):  # noqa: F811
    import json
    import os

    from fedsec.network.keyholder import load_identity
    from fedsec.network.layers.paillier_dealer import SHARE_FILE, deal
    from tests.fedsec.network.keyholder_helpers import identity_path

    base = plan("threshold")
    config = dataclasses.replace(base, dp=dataclasses.replace(base.dp, reproducible=False))
    auditor = study.parties["auditor"]
    shares, _ = deal(roster=list(sites), site_certificates={n: study.parties[n].cert_pem for n in sites},
                     threshold=3, trust=study.trust(), identity=load_identity(identity_path(auditor)),
                     dealer_certificate=auditor.cert_pem)
    for name, record in shares.items():
        directory = tmp_path / "sites" / name
        directory.mkdir(parents=True)
        fd = os.open(directory / SHARE_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record))
    vectors, weights = inputs(1)
    side = Sites(study, config, sites, vectors, weights, tmp_path / "sites")
    context = coordinator_context(study, config, side, 7)
    coordinator = LAYERS["paillier"][0](context)
    zeros = [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)]
    everyone = coordinator.aggregate(1, zeros, purpose="update")
    assert set(everyone.participants) == {0, 1, 2, 3}
    strip = _without_setups(side.exchange)

    def exchange(stage, outgoing):  # the victim is left out of the sum: asked for no submission
        if stage == "paillier/submit":
            outgoing = {c: m for c, m in outgoing.items() if c != 0}
        return strip(stage, outgoing)

    context.exchange = exchange
    try:
        others = coordinator.aggregate(1, zeros, purpose="update")
    except REFUSALS:  # a refusal is the secure outcome
        return
    assert set(others.participants) == {1, 2, 3}
    recovered = (everyone.weighted_sum - others.weighted_sum) / weights[0]
    clip = config.secure.clip
    # secure outcome: the coordinator cannot read site 0's own update
    assert not np.allclose(recovered, np.clip(vectors[0], -clip, clip), atol=1e-3)
