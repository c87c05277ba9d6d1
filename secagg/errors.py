"""The exceptions of ``secagg``: one small hierarchy.

Cryptographic failures (a ciphertext or signature that does not verify, a key that is not a
valid point) all raise the one opaque :class:`CryptoError`, whose message says nothing that
helps an attacker.
"""

from __future__ import annotations


class SecAggError(Exception):
    """Base class of every error raised on purpose by ``secagg``."""


class CryptoError(SecAggError):
    """A cryptographic check failed. Deliberately says nothing about which or why."""

    def __init__(self) -> None:
        super().__init__("cryptographic verification failed")


class InvalidArgumentError(SecAggError, ValueError):
    """An argument is outside its allowed range (sizes, thresholds, bit widths)."""


class EncodingError(SecAggError, ValueError):
    """A vector cannot be encoded: wrong shape, NaN/inf, or a weight outside its bound."""


class WrapRiskError(InvalidArgumentError):
    """An encoder configuration under which a sum could wrap around the modulus."""


class ReconstructionError(SecAggError):
    """Too few, duplicate or inconsistent Shamir shares to reconstruct a secret."""


class InvalidCiphertextError(SecAggError, ValueError):
    """A Paillier ciphertext batch was refused at the boundary: wrong key id, round or count,
    bad framing, or a value that is not a unit of Z_{n^2} (0, >= n^2, or sharing a factor with n).
    Nothing derived from a refused batch is kept."""
