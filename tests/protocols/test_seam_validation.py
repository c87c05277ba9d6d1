"""Item 10 of issue 9: what the aggregation seam does with malformed input.

Caller-side adversary (a buggy or malicious layer above the seam, or clients whose updates it
passes on): repeated ids, ids and weights of the wrong type, vectors that are not finite 1-D real
arrays, odd lengths. Each bad update is rejected: listed in ``dropped``, counted in
``metrics['rejected']``, never summed; the sum of the others is exact within quantisation. A
search over random mixtures asserts that nothing else ever escapes: the call returns a result
accounting for every update, or raises ProtocolAbort.
"""

from __future__ import annotations

import dataclasses
import fractions
import math

import numpy as np
import pytest
from fedsec.fl_core.errors import InvalidParameterError
from fedsec.protocols import encoding as seam
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked import client as rules
from fedsec.protocols.masked import messages as m
from fedsec.protocols.paillier import PaillierAggregation
from fedsec.secagg.encoding import clip_range
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec import fl_core
from tests.protocols.helpers import make_session

LENGTH = 12
BITS = 20


def good(c: int, weight: float = 3.0) -> fl_core.ClientUpdate:
    rng = np.random.default_rng(c)
    return fl_core.ClientUpdate(c, rng.normal(0, 0.3, LENGTH).astype(np.float32), weight)


def protocols():
    yield "masked-complete", MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), bits=BITS)
    yield "masked-harary", MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), bits=BITS,
                                             graph="harary")


def paillier():
    return PaillierAggregation(max_weight=10, rng=np.random.default_rng(0), bits=BITS, key_bits=512,
                               allow_insecure_key=True)


def check_exact(result, honest):
    plain = fl_core.PlainAggregation().aggregate(1, honest)
    assert result.participants == tuple(sorted(u.client_id for u in honest))
    assert result.total_weight == plain.total_weight
    step = 2 / (2**BITS - 1)
    assert np.abs(result.weighted_sum - plain.weighted_sum).max() <= plain.total_weight * step


BAD = {
    "object dtype": lambda c: fl_core.ClientUpdate(c, np.array([0.1] * LENGTH, dtype=object), 2.0),
    "string dtype": lambda c: fl_core.ClientUpdate(c, np.array(["0.1"] * LENGTH), 2.0),
    "complex dtype": lambda c: fl_core.ClientUpdate(c, np.ones(LENGTH, dtype=complex), 2.0),
    "bool dtype": lambda c: fl_core.ClientUpdate(c, np.ones(LENGTH, dtype=bool), 2.0),
    "a list": lambda c: fl_core.ClientUpdate(c, [0.1] * LENGTH, 2.0),
    "2-D": lambda c: fl_core.ClientUpdate(c, np.zeros((LENGTH, 1), np.float32), 2.0),
    "empty": lambda c: fl_core.ClientUpdate(c, np.zeros(0, np.float32), 2.0),
    "NaN": lambda c: fl_core.ClientUpdate(c, np.full(LENGTH, np.nan, np.float32), 2.0),
    "inf": lambda c: fl_core.ClientUpdate(c, np.r_[np.zeros(LENGTH - 1), np.inf], 2.0),
    "short": lambda c: fl_core.ClientUpdate(c, np.zeros(LENGTH - 1, np.float32), 2.0),
    "string weight": lambda c: good(c, "3"),
    "bool weight": lambda c: good(c, True),
    "numpy bool weight": lambda c: good(c, np.bool_(True)),
    "negative weight": lambda c: good(c, -3.0),
    "zero weight": lambda c: good(c, 0),
    "fractional weight": lambda c: good(c, 2.5),
    "NaN weight": lambda c: good(c, math.nan),
    "inf weight": lambda c: good(c, math.inf),
    "weight above max": lambda c: good(c, 11),
    "None weight": lambda c: good(c, None),
    "huge int weight": lambda c: good(c, 10**400),
    "huge fraction weight": lambda c: good(c, fractions.Fraction(10**400, 3)),
    "masked array": lambda c: fl_core.ClientUpdate(
        c, np.ma.masked_array(np.r_[np.nan, np.zeros(LENGTH - 1)], mask=[1] + [0] * (LENGTH - 1)), 2.0),
    "float64 overflow": lambda c: fl_core.ClientUpdate(c, np.full(LENGTH, 1e300, np.longdouble) ** 2, 2.0),
}
BAD_IDS = {"string id": "7", "float id": 7.0, "bool id": True, "negative id": -7, "id 2^64 - 1": 2**64 - 1,
           "id 2^64": 2**64, "None id": None, "list id": [7], "numpy float id": np.float64(7)}


@pytest.mark.parametrize("name,protocol", list(protocols()))
@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_update_is_rejected_and_the_others_are_summed(name, protocol, kind):
    honest = [good(c) for c in (1, 2, 3, 4, 5)]
    result = protocol.aggregate(1, honest + [BAD[kind](6)])
    check_exact(result, honest)
    assert result.dropped == (6,) and result.metrics["rejected"] == 1
    assert len(protocol.last_rejected) == 1 and protocol.last_rejected[0].client_id == 6


@pytest.mark.parametrize("kind", sorted(BAD_IDS))
def test_an_id_that_is_not_a_u64_integer_is_rejected(kind):
    protocol = MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), bits=BITS)
    honest = [good(c) for c in (1, 2, 3)]
    bad = fl_core.ClientUpdate(BAD_IDS[kind], good(9).vector, 2.0)
    result = protocol.aggregate(1, honest + [bad])
    check_exact(result, honest)
    assert len(result.dropped) == 1 and result.dropped[0] is BAD_IDS[kind]
    assert protocol.last_rejected[0].reason == seam.NOT_AN_ID


@pytest.mark.parametrize("name,protocol", list(protocols()))
def test_every_copy_of_a_repeated_id_is_rejected(name, protocol):
    honest = [good(c) for c in (1, 2, 3, 4)]
    twins = [good(5), good(5, 4.0), good(5, 1.0)]
    result = protocol.aggregate(1, honest + twins)
    check_exact(result, honest)
    assert result.dropped == (5, 5, 5) and result.metrics["rejected"] == 3
    assert {r.reason for r in protocol.last_rejected} == {seam.DUPLICATE_ID}


def test_numpy_integer_ids_and_weights_are_accepted_as_ints():
    protocol = MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), bits=BITS)
    honest = [fl_core.ClientUpdate(np.uint64(c), good(c).vector, np.int64(3)) for c in (1, 2, 3)]
    result = protocol.aggregate(1, honest)
    assert result.participants == (1, 2, 3) and all(type(c) is int for c in result.participants)
    assert result.total_weight == 9


def test_lengths_that_tie_for_the_most_common_are_a_protocol_abort():
    protocol = MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), bits=BITS)
    updates = [good(1), good(2), fl_core.ClientUpdate(3, np.zeros(5, np.float32), 1.0),
               fl_core.ClientUpdate(4, np.zeros(5, np.float32), 1.0)]
    with pytest.raises(ProtocolAbort, match="disagree on the length"):
        protocol.aggregate(1, updates)


def test_the_paillier_seam_shares_the_validation():
    protocol = paillier()
    honest = [good(c) for c in (1, 2, 3)]
    bad = [good(3, 2.0), BAD["object dtype"](7), BAD["string weight"](8),
           fl_core.ClientUpdate("x", good(9).vector, 1.0)]
    result = protocol.aggregate(1, honest[:2] + bad[:1] + honest[2:] + bad[1:])
    check_exact(result, honest[:2])
    assert result.dropped == (3, 3, 7, 8, "x") and result.metrics["rejected"] == 5


UPDATE = st.one_of(
    st.builds(lambda c: good(c), st.integers(0, 6)),
    st.builds(lambda kind, c: BAD[kind](c), st.sampled_from(sorted(BAD)), st.integers(0, 6)),
    st.builds(lambda kind: fl_core.ClientUpdate(BAD_IDS[kind], good(0).vector, 1.0),
              st.sampled_from(sorted(BAD_IDS))),
)


@settings(max_examples=15)
@given(updates=st.lists(UPDATE, min_size=0, max_size=7), harary=st.booleans())
def test_a_search_over_malformed_mixtures_never_escapes_the_documented_outcomes(updates, harary):
    protocol = MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), bits=BITS,
                                 graph="harary" if harary else "complete")
    try:
        result = protocol.aggregate(1, updates)
    except ProtocolAbort:
        return
    assert len(result.participants) + len(result.dropped) == len(updates)
    assert result.metrics["rejected"] == len(result.dropped)  # no dropout configured
    summed = [u for u in updates if any(u.client_id is c or (type(u.client_id) is int and u.client_id == c)
                                        for c in result.participants)]
    check_exact(result, summed)


@pytest.mark.parametrize("clip", [1e308, 1e-310, 3e288, 1e-303, math.inf, math.nan, 0.0, -1.0, "1", True])
def test_clips_that_cannot_be_encoded_are_refused_up_front(clip):
    with pytest.raises(InvalidParameterError, match=r"clip must be a number in \["):
        MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), clip=clip)
    with pytest.raises(InvalidParameterError, match="clip"):
        PaillierAggregation(max_weight=10, rng=np.random.default_rng(0), clip=clip, key_bits=512,
                            allow_insecure_key=True)


@pytest.mark.parametrize("end", [0, 1])
def test_the_ends_of_the_clip_range_aggregate_to_finite_exact_sums(end):
    clip = clip_range(BITS)[end]
    protocol = MaskedAggregation(max_weight=10, rng=np.random.default_rng(0), bits=BITS, clip=clip)
    vectors = [np.array([clip, -clip, 0.5 * clip, 0.0]) for _ in range(3)]
    result = protocol.aggregate(1, [fl_core.ClientUpdate(c, v, 2.0) for c, v in enumerate(vectors)])
    expected = 2 * sum(vectors)
    assert np.isfinite(result.weighted_sum).all() and result.metrics["clipped"] == 0
    assert np.all(np.abs(result.weighted_sum - expected) <= 6 * 2 * clip / (2**BITS - 1) * (1 + 1e-9))


@pytest.mark.parametrize("clip", [1e308, 1e-310])
def test_a_client_refuses_session_parameters_with_an_unencodable_clip(clip):
    s = make_session(4, length=6, seed=21)
    out = s.server.outgoing()
    c = min(out)
    header, body = m.decode(out[c], expect=m.SessionParams)
    with pytest.raises(ClientAbort) as info:
        s.clients[c].handle(m.encode(header, dataclasses.replace(body, clip=clip)))
    assert info.value.reason == rules.UNSAFE_PARAMS
