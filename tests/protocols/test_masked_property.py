"""Random federations, graphs and dropout stages: the result is exact, or a clean abort."""

import numpy as np
import pytest
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import run_round
from fedsec.protocols.masked.policy import minimum_threshold, survivor_quorum
from fedsec.protocols.masked.simulation import DROP_STAGES
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocols.helpers import make_session


@settings(max_examples=40)
@given(n=st.integers(3, 14), graph=st.sampled_from(["complete", "harary"]), active=st.booleans(),
       seed=st.integers(0, 2**32), data=st.data())
def test_exact_sum_of_survivors_or_clean_abort(n, graph, active, seed, data):
    s = make_session(n, graph=graph, active=active, seed=seed, length=20)
    k = s.graph.degree
    floor = minimum_threshold(n, k, 0.1, active=active, population=n)
    t = data.draw(st.integers(floor, k), label="threshold")
    s = make_session(n, graph=graph, active=active, seed=seed, length=20, threshold=t)
    ids = sorted(s.clients)
    drops = {c: data.draw(st.sampled_from((None,) + DROP_STAGES)) for c in ids}
    drops = {c: stage for c, stage in drops.items() if stage is not None}
    try:
        trace = run_round(s.server, s.clients, drop_at=drops)
    except ProtocolAbort:
        # Aborting is allowed only when the survivors or share holders really fell short.
        n_left = sum(1 for c in ids if drops.get(c, 99) > 2)
        holders_short = any(
            sum(1 for v in s.graph.neighbours(c) if drops.get(v, 99) > 4) < s.threshold
            for c in ids if drops.get(c, 99) > 1)
        signers = sum(1 for c in ids if drops.get(c, 99) > 3)
        signers_short = active and signers < survivor_quorum(n, 0.1, population=n)
        assert n_left < s.threshold or holders_short or signers_short
        return
    assert not trace.aborts
    total, survivors = s.server.result()
    # Every client that sent its masked input is in the sum, no other.
    assert set(survivors) == {c for c in ids if drops.get(c, 99) > 2}
    assert np.array_equal(total, s.expected_sum(survivors))


@pytest.mark.parametrize("graph", ["complete", "harary"])
@pytest.mark.parametrize("stage", DROP_STAGES)
def test_dropout_at_each_stage(graph, stage):
    s = make_session(12, graph=graph, seed=stage, dropout=0.3)
    victims = sorted(s.clients)[:2]
    run_round(s.server, s.clients, drop_at={c: stage for c in victims})
    total, survivors = s.server.result()
    in_sum = stage > 2
    assert all((c in survivors) == in_sum for c in victims)
    assert len(survivors) == 12 - (0 if in_sum else 2)
    assert np.array_equal(total, s.expected_sum(survivors))


def test_too_many_dropouts_abort_with_a_typed_error_never_a_sum():
    s = make_session(6, seed=3)
    drops = {c: 2 for c in sorted(s.clients)[: 6 - s.threshold + 1]}
    with pytest.raises(ProtocolAbort, match="threshold"):
        run_round(s.server, s.clients, drop_at=drops)
    with pytest.raises(ProtocolAbort):
        s.server.result()


def test_dropouts_during_unmask_beyond_the_threshold_abort():
    s = make_session(6, seed=4)
    drops = {c: 4 for c in sorted(s.clients)[: 6 - s.threshold + 1]}
    with pytest.raises(ProtocolAbort, match="share"):
        run_round(s.server, s.clients, drop_at=drops)
