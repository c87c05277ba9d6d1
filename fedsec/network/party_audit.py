"""One party's audit log in a deployment: messages by kind, size and SHA-256 (never contents),
plan decisions, dropouts, ledger entries, released model digests, and the peer heads it
acknowledges (:class:`fedsec.audit.log.AuditLog` underneath; thread-safe).

A call from a site to the coordinator is two messages: the request (``kind`` = the call's topic)
and the reply (``kind`` = topic + ``.reply``). The site records ``send`` of the request and
``receive`` of the reply; the coordinator ``receive`` of the request and ``send`` of the reply,
each pair in one transaction (one fsync). An empty long poll (nothing to do yet) is recorded by
neither side. Both sides record the round the message belongs to, so ``fedsec audit reconcile``
pairs them.

The coordinator serves calls on many threads; SQLite connections belong to one thread, so every
write goes through one writer thread (each call waits for its write: on disk when it returns).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fedsec.audit.log import AuditLog, Head
from fedsec.secagg.keys import SigningKey

LOG = "audit.db"


def message(direction: str, peer: str, kind: str, payload: bytes) -> dict[str, Any]:
    """Details of a ``send`` (``direction`` = ``"to"``) or ``receive`` (``"from"``) event."""
    return {direction: peer, "kind": kind, "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest()}


class PartyAudit:
    """The audit log ``directory/audit.db`` of the party ``actor``, signed with its identity key."""

    def __init__(self, directory: str | Path, *, actor: str, key: SigningKey, run_id: str) -> None:
        self.actor = actor
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit")
        self.log = self._run(AuditLog, Path(directory) / LOG, actor=actor, key=key, run_id=run_id)

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._writer.submit(fn, *args, **kwargs).result()

    def event(self, action: str, *, round: int | None = None, stage: str | None = None,
              details: dict[str, Any] | None = None, peer_ref: str | None = None) -> None:
        self._run(self.log.append, action, round=round, stage=stage, details=details, peer_ref=peer_ref)

    def sent_then_received(self, peer: str, kind: str, request: bytes, reply: bytes, *,
                           round: int | None = None) -> None:
        """A call this party made: its request to ``peer`` and the reply."""
        self._run(self.log.append_many, [
            ("send", round, None, message("to", peer, kind, request), None),
            ("receive", round, None, message("from", peer, kind + ".reply", reply), None)])

    def received_then_sent(self, peer: str, kind: str, request: bytes, reply: bytes, *,
                           round: int | None = None) -> None:
        """A call this party served: ``peer``'s request and this party's reply."""
        self._run(self.log.append_many, [
            ("receive", round, None, message("from", peer, kind, request), None),
            ("send", round, None, message("to", peer, kind + ".reply", reply), None)])

    def head(self) -> dict[str, Any]:
        """This log's head, to hand to a peer (JSON)."""
        h = self._run(self.log.head)
        return {"actor": h.actor, "fingerprint": h.fingerprint, "seq": h.seq, "hash": h.hash}

    def ack(self, head: dict[str, Any], *, round: int | None = None) -> None:
        """Record a peer's head (see :meth:`AuditLog.ack`); a malformed head is ignored."""
        try:
            peer = Head(str(head["actor"]), str(head["fingerprint"]), int(head["seq"]), str(head["hash"]))
        except (KeyError, TypeError, ValueError):
            return
        self._run(self.log.ack, peer, round=round)

    def close(self) -> None:
        self._run(self.log.close)
        self._writer.shutdown()
