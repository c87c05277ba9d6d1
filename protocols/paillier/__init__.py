"""Paillier homomorphic summation: clients encrypt packed words, the server multiplies, and only a
separate key holder, or t of the clients' key shares, decrypt authenticated aggregates."""

from protocols.paillier.aggregation import PaillierAggregation, default_threshold
from protocols.paillier.client import PaillierClient
from protocols.paillier.coordinator import ThresholdCoordinator
from protocols.paillier.dealer import ThresholdDealer
from protocols.paillier.keyholder import DecryptionRefused, PaillierKeyHolder
from protocols.paillier.server import PaillierServer
from protocols.paillier.spec import RoundSpec

__all__ = ["DecryptionRefused", "PaillierAggregation", "PaillierClient", "PaillierKeyHolder",
           "PaillierServer", "RoundSpec", "ThresholdCoordinator", "ThresholdDealer",
           "default_threshold"]
