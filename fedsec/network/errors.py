"""Typed errors of the network layer; each carries a short machine-readable code."""

from __future__ import annotations


class EnrolmentError(ValueError):
    """A CA or site operation was refused (bad CSR signature, unknown role, unreadable key ...).

    Attributes:
        reason: a short code, e.g. ``"bad_signature"``, ``"unknown_role"``, ``"bad_name"``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class PeerRejected(Exception):
    """A peer's certificate does not admit it to this federation.

    The message is deliberately short (the reason code and the certificate's name at most): it
    is shown to operators, never to the peer, which only sees a gRPC status.

    Attributes:
        reason: one of ``"chain"`` (not issued by the federation's root), ``"not_yet_valid"``,
            ``"expired"``, ``"not_leaf"``, ``"role"`` (a role this end does not accept),
            ``"revoked"``, ``"roster"`` (name not on the roster), ``"malformed"``.
    """

    UNAUTHENTICATED = frozenset({"chain", "not_yet_valid", "expired", "not_leaf", "revoked",
                                 "malformed"})
    """Reasons that mean "not a valid member"; the others mean "valid but not allowed here"."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason if not detail else f"{reason}: {detail}")
        self.reason = reason


class PolicyRefused(Exception):
    """A site's policy refuses the plan; ``rule`` names the first rule violated (CLI exit 3)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule


class MalformedFrame(ValueError):
    """A framed payload is malformed (bad header, over the size limit, length or digest mismatch)."""
