"""Multi-party protocols composing secagg, dp and fl_core into privacy layers."""

from protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from protocols.masked import MaskedAggregation
from protocols.paillier import PaillierAggregation

__all__ = ["ClientAbort", "MalformedMessage", "MaskedAggregation", "PaillierAggregation",
           "ProtocolAbort"]
