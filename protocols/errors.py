"""The exceptions of ``protocols``.

:class:`ProtocolAbort` is what the server side raises when no sum can be released; it is an
``fl_core`` :class:`~fl_core.errors.AggregationError`, so the round is recorded as aborted and
the model left unchanged. :class:`ClientAbort` is an honest client refusing to go on; to the
server that client simply stops answering.
"""

from __future__ import annotations

from fedsec.fl_core.errors import AggregationError


class ProtocolAbort(AggregationError):
    """The server cannot complete the round (too few clients or shares, inconsistent shares)."""


class MalformedMessage(ValueError):
    """A message failed to parse or validate: wrong magic, kind, size, session, round or field."""


class ClientAbort(Exception):
    """An honest client refuses to continue; ``reason`` names the abort rule that fired."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
