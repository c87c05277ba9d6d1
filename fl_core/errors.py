"""The exceptions a user or a peer can cause in ``fl_core``: one small hierarchy.

Every class derives from :class:`FLError`; the ones about bad arguments also derive from
``ValueError`` so scikit-learn style ``except ValueError`` keeps working.
"""

from __future__ import annotations


class FLError(Exception):
    """Base class of every error raised on purpose by ``fl_core``."""


class InvalidParameterError(FLError, ValueError):
    """A constructor or function argument is outside its allowed range or set."""


class ShapeMismatchError(FLError, ValueError):
    """A vector or array does not have the shape the model or protocol expects."""


class NonFiniteError(FLError, ValueError):
    """A vector holds NaN or infinity where only finite numbers are allowed."""


class AggregationError(FLError):
    """The aggregation protocol could not produce a sum for this round.

    Privacy layers raise subclasses of this (``fl_core`` knows none of them); the server loop
    treats any of them as an aborted round: the global model is left unchanged.
    """


class TooFewClientsError(AggregationError):
    """Fewer valid contributions arrived than the protocol needs to release a sum."""

    def __init__(self, received: int, required: int) -> None:
        super().__init__(f"{received} valid client contribution(s), at least {required} required")
        self.received = received
        self.required = required
