"""Cheap PRV epsilon for a long run of identical subsampled-Gaussian steps.

Opacus' ``PRVAccountant.get_epsilon`` (Gopi, Lee and Wutschitz 2021) rebuilds everything for the
step count T of the ledger: the truncation bound L (two RDP evaluations), the mesh
``eps_error / sqrt(T log(12 / delta_error) / 2)``, the discretised PRV of one step on the domain
[-L, L] (CDF at every mesh point, the PRV's mean by quadrature), its real FFT on a domain whose
size is rarely a fast FFT length, the T-th power and the inverse FFT. At round 1,000 of the README
run that is 0.2 to 1 s of CPU, every round.

:class:`RunningPRV` runs the same computation for a *bucket* of step counts: the domain is the one
Opacus builds for the bucket's largest count T_b >= T (``BUCKET_RATIO`` apart), widened on both
sides to a fast FFT length. It keeps the discretised PRV and its FFT for the bucket and the
power F^T by binary powering from cached squarings
(:class:`~fedsec.dp.analysis.spectral_power.BinaryPowers`: the same array for T whatever was
asked before, so a value is a function of the ledger alone), so a round costs one inverse FFT,
about log2(T) / 2 complex multiplications and Opacus'
``compute_epsilon`` scan over the top of the PMF (:meth:`_Bucket.epsilon_upper`).

At large epsilon that inverse FFT is of 3-15 million points (0.1-0.5 s), while only a few dozen
of the coefficients of F^T are not negligible: the bucket then keeps those alone
(:mod:`fedsec.dp.analysis.prv_spectral`) and a round costs about a millisecond. The bucket's
build, once per bucket (every 9 % of growth of T), is Opacus' arithmetic made cheaper: the domain
from the one-step RDP cached per engine (:func:`safe_domain_size`), the CDF evaluated only on the
band where the one-step PMF can be non-zero (:mod:`fedsec.dp.analysis.prv_discretise`), Opacus'
mean quadrature and one real FFT.

Why the result is still a guarantee: Gopi et al.'s error bound (Theorem 5.5 with Remark 5.6, as
Opacus applies it) holds when the mesh is at most ``eps_error / sqrt(T log(12 / delta_error) /
2)`` and the domain covers [-L(T), L(T)]. The mesh for T_b >= T is finer and L(T_b) >= L(T)
(the RDP epsilon grows with the step count and the per-step term is taken at the smaller delta
``delta_error / (8 T_b)``); widening the domain only makes the truncation smaller.
So ``eps_upper`` = estimate + eps_error stays an upper bound on the true epsilon. The estimate
itself moves with the mesh by far less than eps_error; :data:`MARGIN` is added so that the value
reported is never below Opacus' own (tests/dp/test_incremental_accountants.py checks the interval
[Opacus, Opacus + 2 MARGIN] along runs and over random ledgers).
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict

import numpy as np
from fedsec.dp.analysis.prv_discretise import discretise
from fedsec.dp.analysis.prv_spectral import SparseComposition, kept_frequencies
from fedsec.dp.analysis.spectral_power import BinaryPowers
from opacus.accountants.analysis import rdp as opacus_rdp
from opacus.accountants.analysis.prv import (
    Domain,
    PoissonSubsampledGaussianPRV,
    TruncatedPrivacyRandomVariable,
)
from opacus.accountants.analysis.prv.prvs import DiscretePRV
from opacus.accountants.rdp import RDPAccountant
from scipy import fft

EPS_ERROR = 0.01
"""Opacus' default ``eps_error`` (the reported value is the estimate plus this)."""
BUCKETS_PER_DOUBLING = 8
BUCKET_RATIO = 2 ** (1 / BUCKETS_PER_DOUBLING)
"""Step counts share a domain within this ratio (a rebuild every 9 % of growth)."""
MARGIN = 2e-4
"""Added to the bucketed estimate so that it is never below Opacus' value for the exact T (the
differences seen are below 6e-5; tests check |bucketed - Opacus| <= MARGIN)."""
SPARSE_RATIO = 256
"""The sparse composition is used when at most 1 / SPARSE_RATIO of the coefficients are kept
(its search costs about 160 evaluations of the kept ones, the dense one an n-point inverse FFT)."""
CACHE_SIZE = 8
"""Engines kept at most (one per sigma, q, delta; least recently used dropped)."""
CACHE_BYTES = 256 * 2**20
"""Memory the kept engines may hold; least recently used dropped first, the one in use kept."""


def _bucket_exponent(steps: int) -> int:
    j = max(0, math.floor(BUCKETS_PER_DOUBLING * math.log2(max(steps, 1))) - 1)
    while math.ceil(2.0 ** (j / BUCKETS_PER_DOUBLING)) < steps:
        j += 1
    return j


def bucket(steps: int) -> int:
    """The largest step count of the bucket holding ``steps``: the smallest ceil(2^(j / 8)) >=
    ``steps`` (j = 0, 1, ...), so every count of a bucket gets the same domain."""
    return math.ceil(2.0 ** (_bucket_exponent(steps) / BUCKETS_PER_DOUBLING))


def bucket_floor(top: int) -> int:
    """The smallest step count whose bucket is ``top`` (a value of :func:`bucket`): one more
    than the next smaller top, 1 for the first."""
    j = _bucket_exponent(top)
    while j > 0:
        j -= 1
        below = math.ceil(2.0 ** (j / BUCKETS_PER_DOUBLING))
        if below < top:
            return below + 1
    return 1


def one_step_rdp(prv: PoissonSubsampledGaussianPRV) -> np.ndarray:
    """The RDP of one step at Opacus' default orders, as its ``compute_rdp`` builds it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.array([opacus_rdp._compute_rdp(prv.sample_rate, prv.noise_multiplier, order)
                         for order in RDPAccountant.DEFAULT_ALPHAS])


def safe_domain_size(one_step: np.ndarray, top: int, delta_error: float) -> float:
    """Opacus' ``compute_safe_domain_size([prv], [top], EPS_ERROR, delta_error)`` from the cached
    one-step RDP: the same arithmetic (RDP of ``top`` steps is one step's times ``top``), without
    recomputing the RDP series at every order (up to 0.7 s at q = 0.5)."""
    orders = RDPAccountant.DEFAULT_ALPHAS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus' RDP warns about its largest order
        composed = float(opacus_rdp.get_privacy_spent(orders=orders, rdp=one_step * top,
                                                      delta=delta_error / 4)[0])
        single = float(opacus_rdp.get_privacy_spent(orders=orders, rdp=one_step * 1,
                                                    delta=delta_error / (8 * top))[0])
    return max(max(composed, single), EPS_ERROR) + 3


def grid_tail(t_min: float, t_max: float, size: int, start: int) -> np.ndarray:
    """``np.linspace(t_min, t_max, size)[start:]`` without the first ``start`` points: numpy's
    own arithmetic (index times step, plus t_min; the last point t_max), so bit for bit."""
    step = np.subtract(t_max, t_min, dtype=np.float64) / (size - 1)
    t = np.arange(start, size, dtype=np.float64)
    t *= step
    t += t_min
    if size > 1 and t.size:
        t[-1] = t_max
    return t


def _fast_even(size: int) -> int:
    n = fft.next_fast_len(size, real=True)
    while n % 2:
        n = fft.next_fast_len(n + 1, real=True)
    return n


class _Bucket:
    """The discretised one-step PRV on the domain for the step counts ``low`` to ``top`` of one
    bucket, composed either from the few Fourier coefficients that matter
    (:class:`~fedsec.dp.analysis.prv_spectral.SparseComposition`, when at most 1 / ``SPARSE_RATIO``
    of them do) or by Opacus' dense inverse FFT of F^T (binary powering).

    Args:
        prv: the one-step privacy random variable.
        top: the bucket's largest step count (a value of :func:`bucket`).
        delta_error: Opacus' delta_error (delta / 1000 here).
        sparse: force the sparse (True) or dense (False) composition; None chooses.
        rdp: :func:`one_step_rdp` of ``prv``, if already computed.
    """

    def __init__(self, prv: PoissonSubsampledGaussianPRV, top: int, delta_error: float, *,
                 sparse: bool | None = None, rdp: np.ndarray | None = None) -> None:
        half = safe_domain_size(one_step_rdp(prv) if rdp is None else rdp, top, delta_error)
        mesh = EPS_ERROR / np.sqrt(top * np.log(12 / delta_error) / 2)
        aligned = Domain.create_aligned(-half, half, mesh)
        size = _fast_even(aligned.size)
        dt = aligned.dt  # Opacus' domains are [-(n/2 - 1) dt, n/2 dt]: its roll assumes that shape
        domain = Domain(-(size // 2 - 1) * dt, size // 2 * dt, size)
        truncated = TruncatedPrivacyRandomVariable(prv, domain.t_min, domain.t_max)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # log(0) inside Opacus at q = 1
            dprv = discretise(truncated, domain)
        self.top, self.low, self.size = top, bucket_floor(top), size
        self.domain = dprv.domain
        spectrum = fft.rfft(dprv.pmf)
        kept = kept_frequencies(spectrum, self.low)
        if sparse is None:
            sparse = SPARSE_RATIO * kept.size <= size
        self.sparse = (SparseComposition(spectrum=spectrum, size=size, low_steps=self.low,
                                         frequencies=kept) if sparse else None)
        self.dprv = None if sparse else dprv
        self.spectrum = None if sparse else spectrum
        self.powers = None if sparse else BinaryPowers(spectrum)
        self.hint: int | None = None  # the index the last search found (where to start the next)

    @property
    def nbytes(self) -> int:
        if self.sparse is not None:
            return self.sparse.nbytes
        return self.dprv.pmf.nbytes + self.spectrum.nbytes + self.powers.nbytes

    def power(self, steps: int) -> np.ndarray:
        """F^steps by binary powering (dense only): the same array whatever was asked before."""
        if self.powers is None:
            raise ValueError("a sparse bucket keeps no dense spectrum")
        return self.powers.power(steps)

    def placement(self, steps: int) -> tuple[int, Domain]:
        """Opacus' roll of the composed PMF (steps - 1, plus n / 2 for an even count) and the
        composed domain (the mean shift applied ``steps`` times)."""
        shift = steps - 1
        if steps % 2 == 0:
            shift += self.size // 2
        return shift, self.domain.shift_right(self.domain.shifts * (steps - 1))

    def composed(self, steps: int) -> DiscretePRV:
        """Opacus' ``_compose_fourier(dprv, steps)`` from F^T (dense only)."""
        raw, shift, domain = self._raw(steps)
        return DiscretePRV(pmf=np.roll(raw, shift), domain=domain)

    def _raw(self, steps: int) -> tuple[np.ndarray, int, Domain]:
        """The composed PMF before Opacus' roll, the roll and the composed domain."""
        if self.dprv is None:
            raise ValueError("a sparse bucket keeps no dense PMF")
        raw = fft.irfft(self.power(steps), self.size)
        return (raw, *self.placement(steps))

    def epsilon_upper(self, steps: int, delta: float, delta_error: float) -> float:
        """``composed(steps).compute_epsilon(delta, delta_error, EPS_ERROR)[2]``, Opacus' upper
        bound. Sparse: :meth:`SparseComposition.epsilon` (the same search in closed form, equal
        to Opacus' up to rounding, 1e-10 measured). Dense: reading only the top of the PMF: its
        suffix sums from the top are the same sequential sums as Opacus' over the whole array,
        and the hockey-stick curve ``ndelta`` it searches is increasing, so a top slice whose
        search does not end at its first element gives Opacus' index. The slice starts 1/64 of
        the domain below the last search's index (at the top 1/64 for the first) and doubles
        until it does."""
        if np.finfo(np.longdouble).eps * self.size > delta - delta_error:
            if self.sparse is not None:
                raise ValueError("Floating point errors will dominate for such small values of delta. "
                                 "Increase delta or reduce domain size.")  # Opacus' refusal
            raw, shift, domain = self._raw(steps)
            return float(DiscretePRV(pmf=np.roll(raw, shift), domain=domain).compute_epsilon(
                delta, delta_error, EPS_ERROR)[2])
        if self.sparse is not None:
            shift, domain = self.placement(steps)
            value, self.hint = self.sparse.search(steps, shift, domain.t_min, domain.dt,
                                                  delta - delta_error, hint=self.hint)
            return value + EPS_ERROR
        raw, shift, domain = self._raw(steps)
        size = raw.size
        target = delta - delta_error
        part = max(size // 64, 2)
        if self.hint is not None:  # the last round's index: epsilon moves little between rounds
            part = max(part, size - self.hint + size // 64)
        while True:
            start = max(size - part, 0)
            first = (start - shift) % size  # rolled index i holds raw[(i - shift) % size]
            if first + (size - start) <= size:
                p = raw[first:first + size - start]
            else:
                p = np.concatenate((raw[first:], raw[:first + size - start - size]))
            t = grid_tail(domain.t_min, domain.t_max, size, start)
            d1 = np.flip(np.flip(p).cumsum())
            d2 = np.flip(np.flip(p * np.exp(-t)).cumsum())
            ndelta = np.exp(t) * d2 - d1
            i = int(np.searchsorted(ndelta, -target, side="left"))
            if i > 0 or start == 0:
                break
            part *= 2
        if i <= 0:
            raise RuntimeError("Cannot compute epsilon")
        self.hint = start + i
        return float(np.log((d1[i] - target) / d2[i])) + EPS_ERROR


class RunningPRV:
    """Opacus' PRV epsilon upper bound of T Poisson-subsampled Gaussian steps at ``delta``, cheap
    when T grows from call to call (module docstring).

    Args:
        noise_multiplier: sigma > 0.
        sample_rate: q in (0, 1].
        delta: the delta epsilon is computed at, in (0, 1).
    """

    def __init__(self, *, noise_multiplier: float, sample_rate: float, delta: float) -> None:
        self.prv = PoissonSubsampledGaussianPRV(sample_rate, noise_multiplier)
        self.rdp = one_step_rdp(self.prv)
        self.delta = delta
        self.delta_error = delta / 1000
        self.current: _Bucket | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached arrays."""
        return 0 if self.current is None else self.current.nbytes

    def epsilon(self, steps: int) -> float:
        """Epsilon at the engine's delta after ``steps`` >= 1 steps, plus ``MARGIN``."""
        top = bucket(steps)
        if self.current is None or self.current.top != top:
            self.current = _Bucket(self.prv, top, self.delta_error, rdp=self.rdp)
        return self.current.epsilon_upper(steps, self.delta, self.delta_error) + MARGIN


_ENGINES: OrderedDict[tuple[float, float, float], RunningPRV] = OrderedDict()


def running_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """PRV epsilon of ``steps`` subsampled Gaussian steps from the cached engine."""
    key = (float(noise_multiplier), float(sample_rate), float(delta))
    engine = _ENGINES.pop(key, None)
    if engine is None:
        engine = RunningPRV(noise_multiplier=noise_multiplier, sample_rate=sample_rate, delta=delta)
    _ENGINES[key] = engine
    value = engine.epsilon(steps)
    while len(_ENGINES) > 1 and (len(_ENGINES) > CACHE_SIZE
                                 or sum(e.nbytes for e in _ENGINES.values()) > CACHE_BYTES):
        _ENGINES.popitem(last=False)
    return value
