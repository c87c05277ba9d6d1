"""An accountant's epsilon is a function of the ledger alone: whatever the process asked its cached
engines before (a run that grew round by round, a resumed run, a sweep's earlier experiments, a
test before this one), the value for a ledger is bit for bit a fresh process's.

Before, the PLD engine's FFT grid grew 1.15 times past the largest window it had seen and both
running engines advanced F^T from the previous call's power, so the last digits moved with the
path (1.5154468904716334 fresh against 1.5154468854581427 after a run grew to it, at sigma 1.1,
q 0.01, T 1,000): a history.csv could differ from a fresh run's, and a sweep's from separate runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.dp import Accountant
from fedsec.dp.analysis import pld, pld_running, prv_running
from fedsec.dp.analysis.pld_running import RunningPLD, grid_size
from fedsec.dp.analysis.spectral_power import BinaryPowers, multiplications_error
from fedsec.dp.ledger import GaussianEvent
from hypothesis import given, settings
from hypothesis import strategies as st

DELTA = 1e-5


def _spectrum(seed: int, size: int) -> np.ndarray:
    probs = np.random.default_rng(seed).dirichlet(np.ones(size))
    return np.fft.rfft(probs, 2 * size)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), asked=st.lists(st.integers(0, 5000), min_size=1, max_size=8),
       room=st.sampled_from([0, 1 << 12, 1 << 30]))
def test_a_power_is_the_same_array_whatever_was_asked_before(seed, asked, room):
    spectrum = _spectrum(seed, 64)
    warm = BinaryPowers(spectrum, cached_bytes=room)
    for steps in asked:
        got = warm.power(steps).copy()
        fresh = BinaryPowers(spectrum).power(steps)
        assert np.array_equal(got.view(np.uint64), fresh.view(np.uint64))
    assert np.array_equal(spectrum, _spectrum(seed, 64))  # the spectrum is never written


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 7, 128, 1000, 4097])
def test_a_power_is_the_power_within_its_rounding(steps):
    spectrum = _spectrum(3, 50)
    exact = spectrum.astype(np.clongdouble) ** steps
    got = BinaryPowers(spectrum).power(steps)
    # (T - 1) multiplications' rounding relative to |F|^T, well inside eta = 7 u each
    error = np.abs(got - exact.astype(np.complex128))
    allowed = 7 * np.finfo(np.float64).eps * (multiplications_error(steps) + 1) * np.abs(spectrum) ** steps
    assert np.all(error <= allowed + 1e-300)
    if steps == 0:
        assert np.array_equal(got, np.ones_like(spectrum))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_a_bad_step_count_is_refused(bad):
    with pytest.raises(ValueError, match="steps"):
        BinaryPowers(_spectrum(0, 8)).power(bad)


def test_the_grid_ladder_is_fixed_and_holds_the_window():
    sizes = [grid_size(n) for n in range(1, 5000)]
    assert all(size >= n for n, size in zip(range(1, 5000), sizes, strict=True))
    assert all(b >= a for a, b in zip(sizes, sizes[1:]))  # monotone: a growing window never shrinks it
    assert len(set(sizes)) < 60  # rungs, not one size per window
    assert max(size / n for n, size in zip(range(64, 5000), sizes[63:])) < 1.3


@settings(max_examples=25, deadline=None)
@given(sigma=st.sampled_from([0.8, 1.1, 2.0]), q=st.sampled_from([0.01, 0.1, 0.5]),
       d=st.sampled_from([1e-2, 1e-3]), asked=st.lists(st.integers(1, 3000), min_size=2, max_size=6),
       sparse=st.booleans())
def test_the_pld_engine_answers_a_step_count_as_a_fresh_engine_does(sigma, q, d, asked, sparse):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pld_running, "SPARSE", sparse)
        warm = RunningPLD(noise_multiplier=sigma, sample_rate=q, discretisation=d)
        for steps in asked:
            fresh = RunningPLD(noise_multiplier=sigma, sample_rate=q, discretisation=d)
            assert warm.directions(steps, DELTA) == fresh.directions(steps, DELTA)


def _pld_after(history: list[int], steps: int, sigma: float = 1.1, q: float = 0.01) -> float:
    pld_running._ENGINES.clear()
    for earlier in history:
        pld.epsilon([GaussianEvent(sigma, q, earlier)], DELTA)
    return pld.epsilon([GaussianEvent(sigma, q, steps)], DELTA)


def test_the_refined_pld_epsilon_of_a_ledger_ignores_the_path_to_it():
    fresh = _pld_after([], 1000)
    assert _pld_after(list(range(10, 1000, 10)), 1000) == fresh  # a run grown round by round
    assert _pld_after([5000], 1000) == fresh  # a larger run first (a sweep, a test before)
    assert _pld_after([400, 3000, 17], 1000) == fresh  # jumps both ways (a resume)


@pytest.mark.parametrize("sigma,q,steps", [(1.0, 0.01, 20), (3.0, 0.2, 20), (0.9, 0.02, 700)],
                         ids=["dense", "dense, larger q", "sparse"])
def test_the_prv_epsilon_of_a_ledger_ignores_the_path_to_it(sigma, q, steps):
    def after(history):
        prv_running._ENGINES.clear()
        for earlier in history:
            prv_running.running_epsilon(sigma, q, earlier, DELTA)
        return prv_running.running_epsilon(sigma, q, steps, DELTA)

    fresh = after([])
    assert after(list(range(1, steps))) == fresh
    assert after([4 * steps, 3]) == fresh


@pytest.mark.parametrize("mechanism", ["pld", "prv"])
def test_an_accountant_reports_a_fresh_process_value_after_another_run(mechanism):
    def run(steps_per_round, rounds):
        accountant = Accountant(mechanism)
        values = []
        for _ in range(rounds):
            accountant.step(noise_multiplier=1.0, sample_rate=0.05, steps=steps_per_round)
            values.append(accountant.get_epsilon(DELTA))
        return values

    pld_running._ENGINES.clear()
    prv_running._ENGINES.clear()
    first = run(20, 6)
    run(30, 5)  # another experiment with the same (sigma, q) in the same process
    assert run(20, 6) == first
