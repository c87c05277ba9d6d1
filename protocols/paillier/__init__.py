"""Paillier homomorphic summation: clients encrypt packed words, the server multiplies, a separate
key holder decrypts authenticated aggregates only."""

from protocols.paillier.aggregation import PaillierAggregation
from protocols.paillier.client import PaillierClient
from protocols.paillier.keyholder import DecryptionRefused, PaillierKeyHolder
from protocols.paillier.server import PaillierServer
from protocols.paillier.spec import RoundSpec

__all__ = ["DecryptionRefused", "PaillierAggregation", "PaillierClient", "PaillierKeyHolder",
           "PaillierServer", "RoundSpec"]
