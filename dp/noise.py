"""Noise from a cryptographically secure generator.

:class:`SecureRandom` expands a 256-bit key with AES-256 in counter mode (the ``cryptography``
package); the key comes from ``os.urandom`` unless the caller derives it from a seed for a
reproducible experiment (:meth:`SecureRandom.from_seed`; such noise is only as secret as the
seed, so deployments must not use it). numpy's generators (PCG64, Mersenne Twister) are fast but
predictable from their output and are never used for noise or privacy sampling here.

From the uniform 64-bit words: uniforms with 53 random bits, Gaussians by the Box-Muller
transform, Bernoulli masks, Poisson variates (a precomputed inverse-CDF table for small means,
Hörmann's transformed rejection PTRS, as numpy uses, for means >= 10) and symmetric Skellam
variates (the difference of two Poissons). All are vectorised; rejection loops only redraw the
rejected entries.
"""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from fedsec.dp.errors import InvalidPrivacyParameterError
from scipy.special import gammaln

_TABLE_MEAN = 10.0

TRUNCATION_RADIUS = math.sqrt(-2.0 * math.log(2.0 ** -53))
"""No Gaussian from :meth:`SecureRandom.normal` exceeds this many standard deviations (8.5717):
the Box-Muller radius sqrt(-2 ln u) is capped by the smallest uniform, u >= 2^-53."""

MIN_NOISE_MULTIPLIER = 0.5
"""The smallest noise multiplier DP-SGD and client-level DP accept (0, no noise, aside). Against
the truncation, a neighbour's mean shifted by the sensitivity (1 / sigma standard deviations)
puts mass 2 Phi(-(R - 1 / sigma)) outside the other's support: 5.1e-11 per step at sigma = 0.5,
3.7e-14 at sigma = 1 (see :func:`truncation_delta`)."""


def truncation_delta(noise_multiplier: float, steps: int) -> float:
    """The extra delta the truncated sampler adds over ``steps`` Gaussian steps:
    steps * 2 Phi(-(R - 1 / sigma)), R = :data:`TRUNCATION_RADIUS` (a union bound over steps)."""
    if not noise_multiplier > 0:
        return 1.0
    gap = TRUNCATION_RADIUS - 1.0 / noise_multiplier
    if gap <= 0:
        return 1.0
    return min(1.0, steps * math.erfc(gap / math.sqrt(2.0)))


_CHUNK = 16384
"""Elements per torch call in :meth:`SecureRandom.normal`: below torch's parallel grain size, so
the calls never start (and wait on) an OpenMP team on a busy machine."""
_ZERO_CACHE = 1 << 24
"""Bytes of zeros kept for the keystream (requests up to this size reuse them)."""
_zero_bytes = b""


def _unit(words: np.ndarray) -> np.ndarray:
    """Each 64-bit word's top 53 bits k as the float64 k 2^-53, in [0, 1)."""
    return (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _zeros(size: int) -> bytes | memoryview:
    """``size`` zero bytes to encrypt, from a cached buffer when small enough (allocating and
    zero-filling a fresh one costs more than the AES-CTR itself)."""
    global _zero_bytes
    if size > _ZERO_CACHE:
        return bytes(size)
    if len(_zero_bytes) < size:
        _zero_bytes = bytes(max(size, min(2 * len(_zero_bytes), _ZERO_CACHE)))
    return memoryview(_zero_bytes)[:size]


class SecureRandom:
    """A stream of random numbers from AES-256-CTR.

    Args:
        key: 32 bytes; default: fresh from ``os.urandom``.
    """

    def __init__(self, key: bytes | None = None) -> None:
        key = os.urandom(32) if key is None else key
        if len(key) != 32:
            raise InvalidPrivacyParameterError("a SecureRandom key is 32 bytes")
        self._key, self._offset = bytes(key), 0
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    @classmethod
    def from_seed(cls, seed: int, purpose: str) -> SecureRandom:
        """A deterministic stream for a reproducible experiment (not secret: see the module)."""
        return cls(hashlib.sha256(f"fedsec/dp/{purpose}/{seed}".encode()).digest())

    def state_dict(self) -> dict[str, str | int]:
        """The key (hex) and the number of bytes drawn so far: enough to continue the stream.

        Holds the key, so it is as secret as the noise: write it to disk only for a reproducible
        experiment (:meth:`from_seed`), whose key the seed gives away anyway.
        """
        return {"key": self._key.hex(), "offset": self._offset}

    def load_state_dict(self, state: dict[str, str | int]) -> None:
        """Continue the stream of :meth:`state_dict` (the same key, ``offset`` bytes in)."""
        key, offset = bytes.fromhex(str(state["key"])), int(state["offset"])
        if len(key) != 32 or offset < 0:
            raise InvalidPrivacyParameterError("a SecureRandom state is a 32-byte key and an offset >= 0")
        block, skip = divmod(offset, 16)
        counter = block.to_bytes(16, "big")
        self._key, self._offset = key, offset
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
        self._encryptor.update(bytes(skip))

    def words(self, size: int) -> np.ndarray:
        """``size`` uniform 64-bit words (the keystream: AES-CTR of zeros)."""
        self._offset += 8 * size
        return np.frombuffer(self._encryptor.update(_zeros(8 * size)), dtype=np.uint64)

    def uniform(self, size: int) -> np.ndarray:
        """Uniform float64 in [0, 1) with 53 random bits each."""
        return _unit(self.words(size))

    def _open_uniform(self, size: int) -> np.ndarray:
        """Uniform float64 in (0, 1]."""
        return 1.0 - self.uniform(size)

    def normal(self, size: int, scale: float = 1.0, dtype: type = np.float64) -> np.ndarray:
        """Gaussian N(0, scale^2) by Box-Muller, computed in float64 and returned as ``dtype``
        (float64 or float32, rounded to nearest): radius sqrt(-2 ln u1) times the cosine, then the
        sine, of 2 pi u2, the u1 from the first ceil(size / 2) words of the stream and the u2
        from the next (the cosine and sine by torch's vectorised kernels, several times faster
        than numpy's here). Worked through in chunks, so that no temporary is larger than a
        chunk: fresh large temporaries cost more in page faults than the arithmetic."""
        half = (size + 1) // 2
        words = self.words(2 * half)
        out = np.empty(2 * half, dtype=dtype)
        for start in range(0, half, _CHUNK):  # chunks below torch's grain: one thread each
            end = min(start + _CHUNK, half)
            radius = np.sqrt(-2.0 * np.log(1.0 - _unit(words[start:end])))
            angle = torch.from_numpy(_unit(words[half + start:half + end])).mul_(2.0 * np.pi)
            cosine = torch.cos(angle).numpy()
            for first, trig in ((start, cosine), (half + start, angle.sin_().numpy())):
                value = radius * trig
                if scale != 1.0:
                    value *= scale
                out[first:first + end - start] = value
        return out[:size]

    def bernoulli(self, p: float, size: int) -> np.ndarray:
        """Boolean mask, each True with probability p: exactly ``uniform(size) < p``, compared as
        integers without the float conversion (u = k 2^-53 < p iff k < ceil(p 2^53))."""
        if not math.isfinite(p):
            return self.uniform(size) < p
        threshold = min(max(math.ceil(p * 2.0 ** 53), 0), 2 ** 53)
        return (self.words(size) >> np.uint64(11)) < np.uint64(threshold)

    def poisson(self, mean: float, size: int) -> np.ndarray:
        """Poisson(mean) int64 variates."""
        if not (math.isfinite(mean) and mean >= 0):
            raise InvalidPrivacyParameterError(f"Poisson mean must be finite and >= 0, got {mean}")
        if mean == 0:
            return np.zeros(size, dtype=np.int64)
        if mean < _TABLE_MEAN:
            return self._poisson_table(mean, size)
        return self._poisson_ptrs(mean, size)

    def skellam(self, variance: float, size: int) -> np.ndarray:
        """Symmetric Skellam int64 variates of the given variance: Poisson(v/2) - Poisson(v/2)."""
        return self.poisson(variance / 2, size) - self.poisson(variance / 2, size)

    def _poisson_table(self, mean: float, size: int) -> np.ndarray:
        top = int(mean + 40 * math.sqrt(mean) + 40)
        k = np.arange(top + 1)
        cdf = np.cumsum(np.exp(k * math.log(mean) - mean - gammaln(k + 1)))
        return np.searchsorted(cdf, self.uniform(size), side="right").astype(np.int64)

    def _poisson_ptrs(self, mean: float, size: int) -> np.ndarray:
        # Hörmann (1993), "The transformed rejection method for generating Poisson random variables".
        slam, loglam = math.sqrt(mean), math.log(mean)
        b = 0.931 + 2.53 * slam
        a = -0.059 + 0.02483 * b
        log_inv_alpha = math.log(1.1239 + 1.1328 / (b - 3.4))
        vr = 0.9277 - 3.6224 / (b - 2)
        out = np.empty(size, dtype=np.int64)
        pending = np.arange(size)
        while pending.size:
            n = pending.size
            u = self.uniform(n) - 0.5
            v = self._open_uniform(n)
            us = 0.5 - np.abs(u)
            k = np.floor((2 * a / np.maximum(us, 1e-300) + b) * u + mean + 0.43)
            quick = (us >= 0.07) & (v <= vr)
            valid = (k >= 0) & ~((us < 0.013) & (v > us))
            with np.errstate(divide="ignore", invalid="ignore"):
                slow = valid & (np.log(v) + log_inv_alpha - np.log(a / (us * us) + b)
                                <= -mean + k * loglam - gammaln(k + 1))
            accept = quick | slow
            out[pending[accept]] = k[accept].astype(np.int64)
            pending = pending[~accept]
        return out
