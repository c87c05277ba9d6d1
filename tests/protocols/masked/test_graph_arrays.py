"""The vectorised ring lookups equal the per-client ones."""

from __future__ import annotations

import numpy as np
from fedsec.protocols.masked.graph import RingGraph
from hypothesis import given
from hypothesis import strategies as st


@st.composite
def graphs(draw):
    n = draw(st.integers(3, 16))
    ids = draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n, unique=True))
    return RingGraph(tuple(ids), draw(st.sampled_from([n - 1] + list(range(2, n - 1, 2)))))


@given(graphs(), st.lists(st.integers(0, 2**64 - 1), max_size=6))
def test_positions_equal_position(graph, strangers):
    ids = np.array(list(graph.ring) + strangers, dtype=np.uint64)
    assert graph.positions(ids).tolist() == [graph.position(int(c)) for c in ids]


def test_positions_of_negative_ids_are_minus_one():
    graph = RingGraph((0, 5, 9), 2)
    assert graph.positions(np.array([-1, 0, 9, -9], dtype=np.int64)).tolist() == [-1, 0, 2, -1]


@given(graphs())
def test_x_at_equals_x_of_for_every_pair(graph):
    n = len(graph.ring)
    owner, holder = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    expected = [[graph.x_of(u, v) for v in graph.ring] for u in graph.ring]
    assert graph.x_at(owner, holder).tolist() == expected


@given(graphs())
def test_neighbour_positions_equal_neighbours_and_x_is_symmetric(graph):
    n, k = len(graph.ring), graph.degree
    rows = graph.neighbour_positions(np.arange(n))
    for p, u in enumerate(graph.ring):
        assert [graph.ring[q] for q in rows[p].tolist()] == list(graph.neighbours(u))
        for x, v in enumerate(graph.neighbours(u), start=1):
            assert graph.x_of(v, u) == k + 1 - x
