"""A site's contribution goes into at most one aggregation, ever (review findings R1-R4).

Adversary: the coordinator, alone. It posts any sequence of ``evaluate``/``moments`` jobs and layer
setups naming any purpose and round, and may make the site restart (a restarted site reopens its
``site.db``). The site is the project's unmodified :class:`SiteWork` with its durable record, driven
as ``Site._jobs`` drives it (``tests/review/harness``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from fedsec.fl_core.federated_eval import sums_length
from fedsec.protocols.errors import ClientAbort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.network.envelope import vector_bytes
from fedsec.network.errors import PolicyRefused
from fedsec.network.site_state import SiteState
from fedsec.network.site_work import SiteWork
from tests.review.harness import REFUSALS, Ring

N = 4


def _durable(ring: Ring, k: int) -> str:
    """Give site ``k`` the durable record a deployed site has (``Site._run``); returns the run id."""
    sha = hashlib.sha256(ring.d.plan.read_bytes()).hexdigest()
    site = ring.sites[k]
    site.work.record = site.context.sessions.record(sha)
    return sha


def _restart(ring: Ring, k: int, sha: str) -> None:
    """Site ``k``'s process restarts: a fresh SiteWork over the same site.db."""
    site = ring.sites[k]
    site.context.sessions.close()
    state = SiteState(ring.d.state(k))
    site.context.sessions = state
    site.work = SiteWork.load(ring.config, name=site.name, path=ring.d.data[k], record=state.record(sha))
    site.layer = None


@pytest.fixture
def ring(tmp_path):
    ring = Ring(tmp_path / "d", N)
    yield ring
    ring.close()


def test_a_restarted_site_refuses_an_evaluation_it_already_contributed(ring):
    sha = _durable(ring, 0)
    model = vector_bytes(np.zeros(ring.sites[0].work.length, dtype=np.float32))
    for k in range(N):
        ring.job(k, "evaluate", {"round": 1}, model)
    everyone = ring.aggregate(list(range(N)), purpose="statistics", round_index=1, length=sums_length(2))
    assert set(everyone.participants) == set(range(N))
    _restart(ring, 0, sha)
    with pytest.raises(PolicyRefused) as refused:
        ring.job(0, "evaluate", {"round": 1}, model)
    assert refused.value.rule == "contribution.used"
    ring.job(0, "evaluate", {"round": 2}, model)  # the next plan round is still answered
    with pytest.raises(PolicyRefused) as beyond:
        ring.job(0, "evaluate", {"round": ring.config.rounds + 1}, model)
    assert beyond.value.rule == "evaluation.round"


def test_a_restarted_site_refuses_feature_moments_it_already_contributed(ring):
    sha = _durable(ring, 0)
    features = ring.sites[0].work.input_shape[0]
    sizes = [len(s.work.train_data) for s in ring.sites]
    for k in range(N):
        ring.job(k, "moments", {"stage": 1})
    ring.aggregate(list(range(N)), purpose="statistics", round_index=0, length=features,
                   max_weight=max(sizes))
    _restart(ring, 0, sha)
    with pytest.raises(PolicyRefused):
        ring.job(0, "moments", {"stage": 1})
    ring.job(0, "moments", {"stage": 2}, np.zeros(features, dtype="<f8").tobytes())


def test_a_contribution_is_consumed_at_the_setup_even_if_the_aggregation_never_ends(ring):
    """The first setup naming it consumes it: a second setup, a re-sent job, or the same job after
    a restart is refused, whether or not the first aggregation finished."""
    sha = _durable(ring, 0)
    model = vector_bytes(np.zeros(ring.sites[0].work.length, dtype=np.float32))
    ring.job(0, "evaluate", {"round": 1}, model)
    ring.sites[0].work.contribution("statistics", 1)
    with pytest.raises(ClientAbort):
        ring.sites[0].work.contribution("statistics", 1)
    for restart in (False, True):
        if restart:
            _restart(ring, 0, sha)
        with pytest.raises(PolicyRefused):
            ring.job(0, "evaluate", {"round": 1}, model)


OPERATIONS = st.one_of(
    st.tuples(st.just("evaluate"), st.sampled_from([-1, 0, 1, 2, 3, 4, 999])),
    st.tuples(st.just("moments"), st.sampled_from([1, 2])),
    st.tuples(st.just("setup"), st.tuples(st.sampled_from(["statistics", "update", "other"]),
                                          st.sampled_from([0, 1, 2, 3, 999]))),
    st.tuples(st.just("restart"), st.none()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=st.lists(OPERATIONS, min_size=1, max_size=14))
def test_search_no_contribution_reaches_two_aggregations(ring, script):
    """Random job/setup/restart sequences: every (kind, round) the site hands a layer is handed
    once, evaluation rounds lie in the plan's 1..rounds, each moments stage at most once."""
    k = 0
    site = ring.sites[k]
    site.context.sessions.close()
    directory = ring.d.state(k)
    for name in ("site.db", "site.db-wal", "site.db-shm"):
        (directory / name).unlink(missing_ok=True)
    sha = hashlib.sha256(ring.d.plan.read_bytes()).hexdigest()
    site.context.sessions = SiteState(directory)
    site.work = SiteWork.load(ring.config, name=site.name, path=ring.d.data[k],
                              record=site.context.sessions.record(sha))
    model = vector_bytes(np.zeros(site.work.length, dtype=np.float32))
    features = site.work.input_shape[0]
    handed: list[tuple[str, int]] = []
    for operation, argument in script:
        work = ring.sites[k].work
        try:
            if operation == "evaluate":
                work.evaluate({"round": argument}, model)
            elif operation == "moments":
                work.moments({"stage": argument}, np.zeros(features, dtype="<f8").tobytes())
            elif operation == "setup":
                kind = work.pending.kind if work.pending is not None else None
                work.contribution(*argument)
                handed.append((kind, argument[1]))
            else:
                _restart(ring, k, sha)
        except REFUSALS:
            continue
    assert len(handed) == len(set(handed))
    assert all(1 <= r <= ring.config.rounds for kind, r in handed if kind == "evaluation")
    assert all(r == 0 for kind, r in handed if kind.startswith("moments"))
