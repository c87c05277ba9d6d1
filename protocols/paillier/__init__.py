"""Paillier homomorphic summation: clients encrypt packed words, the server multiplies, and only a
separate key holder, or t of the clients' key shares, decrypt authenticated aggregates."""

from fedsec.protocols.paillier.aggregation import PaillierAggregation, default_threshold
from fedsec.protocols.paillier.client import PaillierClient
from fedsec.protocols.paillier.coordinator import ThresholdCoordinator
from fedsec.protocols.paillier.dealer import ThresholdDealer
from fedsec.protocols.paillier.keyholder import DecryptionRefused, PaillierKeyHolder
from fedsec.protocols.paillier.server import PaillierServer
from fedsec.protocols.paillier.spec import RoundSpec

__all__ = ["DecryptionRefused", "PaillierAggregation", "PaillierClient", "PaillierKeyHolder",
           "PaillierServer", "RoundSpec", "ThresholdCoordinator", "ThresholdDealer",
           "default_threshold"]
