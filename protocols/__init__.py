"""Multi-party protocols composing secagg, dp and fl_core into privacy layers."""

from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.paillier import PaillierAggregation

__all__ = ["ClientAbort", "MalformedMessage", "MaskedAggregation", "PaillierAggregation",
           "ProtocolAbort"]
