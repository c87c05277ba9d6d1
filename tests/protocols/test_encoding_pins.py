"""A client refuses encoder parameters other than the ones its policy pins (review r9 finding 6).

Adversary: a lying server that changes ``bits``, ``clip`` or ``word_slack`` in the session
parameters. With client-level DP every client adds integer noise to its encoded words; raising
``bits`` scales the signal up against that noise (the noise is then negligible in the decoded
sum), and lowering ``word_slack`` removes the room the noise needs. A client whose policy pins
the encoding refuses with UNSAFE_PARAMS; ``MaskedAggregation`` (and through it the DP wiring)
pins what it was configured with.
"""

import dataclasses

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked import aggregation as layer_module
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.client import ClientPolicy
from fedsec.protocols.privacy import ClientLevelDP

from tests.protocols.helpers import make_session
from tests.protocols.test_abort_rules import advance, tampered

PINNED = {"clip": 1.0, "bits": 12, "min_word_slack": 0}


@pytest.mark.parametrize("change", [{"bits": 20}, {"bits": 8}, {"clip": 0.5}, {"clip": 4.0},
                                    {"word_slack": 3}])
def test_a_client_refuses_encoder_parameters_other_than_its_pinned_ones(change):
    s = make_session(6, seed=41, bits=12)
    out = advance(s, "advertise keys")
    slack = 4 if "word_slack" in change else 0
    for c in s.clients:
        s.clients[c]._ctx.policy = ClientPolicy(**(PINNED | {"min_word_slack": slack}))
    for c, message in out.items():
        lie = tampered(message, m.SessionParams, lambda b: dataclasses.replace(b, **change))
        with pytest.raises(ClientAbort) as info:
            s.clients[c].handle(lie)
        assert info.value.reason == rules.UNSAFE_PARAMS
    # The unchanged parameters are accepted under the same pins.
    s = make_session(6, seed=41, bits=12)
    out = advance(s, "advertise keys")
    c = sorted(out)[0]
    s.clients[c]._ctx.policy = ClientPolicy(**PINNED)
    assert s.clients[c].handle(out[c])


def test_the_layer_and_the_dp_wiring_pin_what_they_were_configured_with(monkeypatch):
    seen = []
    real = layer_module.build_round

    def recording(**kwargs):
        seen.append(kwargs["policy"])
        return real(**kwargs)

    monkeypatch.setattr(layer_module, "build_round", recording)
    inner = MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), clip=0.5, bits=14, population=8)
    slacks = []
    real_aggregate = inner.aggregate

    def noting_the_noise(*args, **kwargs):
        slacks.append(inner.client_noise.slack)
        return real_aggregate(*args, **kwargs)

    monkeypatch.setattr(inner, "aggregate", noting_the_noise)
    layer = ClientLevelDP(inner, clip_norm=0.5, noise_multiplier=1.0, random=SecureRandom())
    rng = np.random.default_rng(2)
    updates = [ClientUpdate(client_id=c, vector=rng.normal(0, 0.1, 4), weight=1) for c in range(6)]
    layer.aggregate(1, updates)
    policy = seen[-1]
    assert (policy.clip, policy.bits, policy.population, policy.require_active) == (0.5, 14, 8, True)
    assert policy.min_word_slack == slacks[-1] > 0
