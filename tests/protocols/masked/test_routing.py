"""Share bundles routed as byte slices reach exactly whom the simple per-bundle routing reaches, in
the same order, with the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.framing import frame
from fedsec.protocols.masked.graph import RingGraph
from fedsec.protocols.masked.routing import BundleRouter
from hypothesis import given
from hypothesis import strategies as st

SESSION = bytes(16)


@st.composite
def rounds(draw):
    n = draw(st.integers(3, 14))
    ids = draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n, unique=True))
    degrees = [n - 1] + [k for k in range(2, n - 1, 2)]
    graph = RingGraph(tuple(ids), draw(st.sampled_from(degrees)))
    senders = draw(st.lists(st.sampled_from(ids), unique=True))
    sealed = {}
    for v in senders:
        recipients = draw(st.permutations(list(graph.neighbours(v))))
        recipients = recipients[: draw(st.integers(0, len(recipients)))]
        sealed[v] = {c: draw(st.binary(min_size=m.SEALED_BYTES, max_size=m.SEALED_BYTES)) for c in recipients}
    return graph, sealed


@given(rounds())
def test_routed_slices_equal_the_simple_routing(case):
    graph, sealed = case
    router = BundleRouter(graph)
    for v, bundles in sealed.items():
        router.add(v, np.array(list(bundles), dtype=np.uint64), b"".join(bundles.values()))
    router.seal()
    for c in graph.ring:
        simple = m.ForwardedShares(tuple((v, sealed[v][c]) for v in graph.neighbours(c)
                                         if v in sealed and c in sealed[v]))
        built = frame(m.ForwardedShares.KIND, SESSION, 3, c, router.body(c))
        assert built == m.encode(m.Header(0, SESSION, 3, m.SERVER, c), simple)


def test_a_bundle_for_a_non_neighbour_or_a_stranger_is_refused():
    graph = RingGraph((10, 11, 12, 13, 14, 15), 2)
    for recipient in (13, 99):
        router = BundleRouter(graph)
        router.add(10, np.array([recipient], dtype=np.uint64), bytes(m.SEALED_BYTES))
        with pytest.raises(ValueError):
            router.seal()


def test_bundles_of_the_wrong_size_are_refused():
    router = BundleRouter(RingGraph((1, 2, 3), 2))
    with pytest.raises(ValueError):
        router.add(1, np.array([2], dtype=np.uint64), bytes(m.SEALED_BYTES - 1))
