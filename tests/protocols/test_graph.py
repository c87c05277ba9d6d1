import pytest
from fedsec.protocols.masked.graph import RingGraph, choose_parameters, shuffled_ring, threshold_for
from fedsec.secagg.errors import InvalidArgumentError
from hypothesis import given
from hypothesis import strategies as st


@given(n=st.integers(3, 60), data=st.data())
def test_neighbourhoods_and_x_coordinates(n, data):
    k = data.draw(st.sampled_from([n - 1] + list(range(2, n - 1, 2))))
    graph = RingGraph(shuffled_ring(list(range(100, 100 + n))), k)
    for u in graph.ring:
        neighbours = graph.neighbours(u)
        assert len(neighbours) == len(set(neighbours)) == k and u not in neighbours
        assert [graph.x_of(u, v) for v in neighbours] == list(range(1, k + 1))
        assert all(graph.is_neighbour(v, u) for v in neighbours)  # symmetric
        assert all(graph.x_of(u, v) == 0 for v in graph.ring if v not in neighbours)


def test_fcp_reference_point():
    """FCP's parameter finder: degree 286, threshold 150 at n = 1000, 1/3 corrupt + 1/3 dropout."""
    p = choose_parameters(1000, dropout=1 / 3, corrupt=1 / 3)
    assert 270 <= p.degree <= 300 and 140 <= p.threshold <= 160


@pytest.mark.parametrize("active", [False, True])
@pytest.mark.parametrize("n,dropout,corrupt", [(1000, 0.1, 0.1), (500, 0.2, 0.05), (100, 0.1, 0.1),
                                               (50, 0.3, 0.0), (5, 0.1, 0.1)])
def test_rule_meets_its_own_conditions(n, dropout, corrupt, active):
    p = choose_parameters(n, dropout=dropout, corrupt=corrupt, active=active)
    assert p.degree // 2 < p.threshold <= p.degree
    assert p.threshold == min(threshold_for(p.degree, p.corrupt_bound, active=active), p.degree)
    assert p.threshold > p.corrupt_bound or p.degree == n - 1
    if p.degree < n - 1:
        assert p.degree - p.dropout_bound >= p.threshold
        smaller = choose_parameters(n, dropout=dropout, corrupt=corrupt, active=active)
        assert smaller.degree == p.degree  # deterministic


def test_sparse_graph_is_much_smaller_than_complete_at_scale():
    assert choose_parameters(1000, dropout=0.1, corrupt=0.1).degree < 100
    assert choose_parameters(1000, dropout=0.1, corrupt=0.1, graph="complete").degree == 999


@pytest.mark.parametrize("ring,k", [((1,), 0), ((1, 2, 3, 4, 5), 3), ((1, 2, 3, 4, 5), 6), ((1, 1, 2), 2)])
def test_bad_graphs(ring, k):
    with pytest.raises(InvalidArgumentError):
        RingGraph(ring, k)


def test_ring_order_is_shuffled():
    orders = {shuffled_ring(list(range(20))) for _ in range(5)}
    assert len(orders) > 1
