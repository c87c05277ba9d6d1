"""The noise source is AES-CTR (a CSPRNG), and its distributions are right."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from fedsec.dp import SecureRandom
from scipy import stats


def test_the_stream_is_aes_256_ctr_keyed_from_the_os():
    key = bytes(range(32))
    words = SecureRandom(key).words(64)
    expected = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(512))
    assert words.tobytes() == expected
    assert not np.array_equal(SecureRandom().words(8), SecureRandom().words(8))
    a, b = SecureRandom.from_seed(7, "x"), SecureRandom.from_seed(7, "x")
    assert np.array_equal(a.normal(100), b.normal(100))
    assert not np.array_equal(SecureRandom.from_seed(7, "y").normal(100), a.normal(100))


def test_numpy_random_is_not_used(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("numpy's generator used for noise")

    monkeypatch.setattr(np.random, "default_rng", forbidden)
    monkeypatch.setattr(np.random, "normal", forbidden)
    r = SecureRandom()
    r.normal(10), r.poisson(3.0, 10), r.poisson(300.0, 10), r.skellam(50.0, 10), r.bernoulli(0.5, 10)


@pytest.mark.parametrize("mean", [0.4, 3.0, 9.9, 10.0, 57.0, 4000.0])
def test_poisson_matches_its_distribution(mean):
    x = SecureRandom(bytes(32)).poisson(mean, 60_000)
    lo, hi = int(stats.poisson.ppf(1e-4, mean)), int(stats.poisson.ppf(1 - 1e-4, mean))
    edges = np.unique(np.linspace(lo, hi + 1, 30).astype(int))
    observed = np.histogram(np.clip(x, lo, hi), bins=edges)[0]
    cdf = stats.poisson.cdf(edges - 1, mean)
    cdf[0], cdf[-1] = 0.0, 1.0
    expected = np.diff(cdf) * x.size
    assert stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-4


def test_gaussian_and_skellam_moments():
    r = SecureRandom(bytes(32))
    z = r.normal(200_000, 3.0)
    assert abs(z.mean()) < 0.03 and abs(z.std() - 3.0) < 0.02
    assert stats.kstest(z / 3.0, "norm").pvalue > 1e-4
    s = r.skellam(1e4, 200_000)
    assert s.dtype == np.int64 and abs(s.mean()) < 1.0 and abs(s.var() / 1e4 - 1) < 0.02
    assert abs(r.bernoulli(0.3, 100_000).mean() - 0.3) < 0.006
