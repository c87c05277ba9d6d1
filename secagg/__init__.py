"""Cryptography for secure aggregation, with no federated-learning knowledge.

Shamir sharing over GF(2^256 + 297), the AES-CTR mask PRG, X25519/HKDF/AES-GCM/Ed25519 recipes,
the shared fixed-point encoder, and packed Paillier (:mod:`secagg.paillier`).
"""

from fedsec.secagg.encoding import Encoded, FixedPointEncoder
from fedsec.secagg.errors import (
    CryptoError,
    EncodingError,
    InvalidArgumentError,
    InvalidCiphertextError,
    ReconstructionError,
    SecAggError,
    WrapRiskError,
)
from fedsec.secagg.prg import MaskExpander

__all__ = ["CryptoError", "Encoded", "EncodingError", "FixedPointEncoder", "InvalidArgumentError",
           "InvalidCiphertextError", "MaskExpander", "ReconstructionError", "SecAggError",
           "WrapRiskError"]
