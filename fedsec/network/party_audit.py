"""One party's audit log in a deployment: messages by kind, size and SHA-256 (never contents),
plan decisions, dropouts, ledger entries, released model digests, and the peer heads it
acknowledges (:class:`fedsec.audit.log.AuditLog` underneath; thread-safe).

A call from a site to the coordinator is two messages: the request (``kind`` = the call's topic)
and the reply (``kind`` = topic + ``.reply``). Each side records the whole call in one row: the
caller ``call`` (``to``, ``kind``, the request's ``size`` and ``sha256``, and ``reply``: the
reply's ``size`` and ``sha256``), the server ``served`` (``from``, the same fields). ``fedsec
audit reconcile`` reads a ``call`` row as the ``send`` of the request and the ``receive`` of the
reply, a ``served`` row as the ``receive`` of the request and the ``send`` of the reply, and
pairs them with the peer's rows as it pairs ``send`` and ``receive`` rows (which older logs and
the key holder's hold). One row a call instead of two: half the signatures, hash-chain links and
SQLite rows, the same facts. An empty long poll (nothing to do yet) is recorded by neither side.
Both sides record the round the call belongs to, so ``fedsec audit reconcile`` pairs them.

The coordinator serves calls on many threads; SQLite connections belong to one thread, so every
write goes through one writer thread, which commits whatever is waiting in one transaction (group
commit: one fsync for the events of many concurrent calls), in the order the events were made.

Durability rule (group commit): a row is on disk (``synchronous = FULL``) before anything that
depends on it leaves the party. The message rows (``call``/``served``) are queued without waiting:
nothing depends on them; so are the acknowledgements of a peer's head (:meth:`PartyAudit.ack`).
They are committed together with the next row someone waits for, or after at most ``linger``
seconds (:data:`LINGER`), whichever comes first: one transaction for the calls of a quarter second
rather than one per call. Every other event
(:meth:`PartyAudit.event`) waits until it and every row queued before it
are committed, and so does :meth:`PartyAudit.head`, which hands this log's head to a peer: an
acknowledged head never names a row that is not on disk. Released models, ledger charges and
consumed contributions are recorded with ``event`` (the contribution in the site's own durable
``site.db`` first) before what depends on them is sent. A crash can lose only message rows of the
calls since the last waited-for event, queued in its last ``linger`` seconds. If a queued batch
fails to commit, every later call raises that error: the log stops rather than skip rows.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519

from fedsec.audit.log import AuditLog, Head, canonical_json, fingerprint
from fedsec.network.framing import payload_sha256
from fedsec.secagg.keys import SigningKey

LOG = "audit.db"
Item = tuple[str, int | None, str | None, dict[str, Any] | None, str | None]
HEAD_HASH = re.compile(r"[0-9a-f]{64}")
"""A head's ``hash``: exactly 64 lowercase hexadecimal characters (a SHA-256 digest)."""
MAX_TEXT = 4096
"""The longest ``action``/``stage``/``peer_ref`` an audit row takes (characters)."""
MAX_DETAILS = 65536
"""The longest canonical JSON ``details`` an audit row takes (characters)."""
LINGER = 0.25
"""Seconds queued message rows (and acks) may wait for more rows before the writer commits them
(sooner when an event or a head is asked for): one transaction, one fsync, for the rows of
several calls instead of one per call (a site makes one call at a time)."""
MAX_LINGERING = 512
"""Queued rows that are committed at once, without waiting out :data:`LINGER`."""
SQLITE_INT = 2**63
"""SQLite integers are signed 64-bit: a round or row number must lie in [-2**63, 2**63)."""


def row_problem(item: Item) -> str | None:
    """Why ``item`` (``(action, round, stage, details, peer_ref)``) could not be stored as an audit
    row, or None: every text field a str of at most :data:`MAX_TEXT` characters that encodes as
    UTF-8, ``round`` None or a 64-bit int, ``details`` canonical JSON of at most :data:`MAX_DETAILS`
    characters. Checked before a row is queued, so one bad value (possibly a peer's) never fails a
    group-commit batch holding other parties' rows."""
    action, round_, stage, details, peer_ref = item
    for name, text in (("action", action), ("stage", stage), ("peer_ref", peer_ref)):
        if text is None and name != "action":
            continue
        if not isinstance(text, str) or len(text) > MAX_TEXT:
            return f"{name}: not a string of at most {MAX_TEXT} characters"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return f"{name}: not encodable as UTF-8"
    if round_ is not None and (isinstance(round_, bool) or not isinstance(round_, int)
                               or not -SQLITE_INT <= round_ < SQLITE_INT):
        return "round: not a 64-bit integer"
    try:
        text = canonical_json(details or {})
    except (TypeError, ValueError):
        return "details: not canonical JSON"
    if len(text) > MAX_DETAILS:
        return f"details: longer than {MAX_DETAILS} characters"
    return None


def message(direction: str, peer: str, kind: str, payload: bytes) -> dict[str, Any]:
    """Details of a ``send`` (``direction`` = ``"to"``) or ``receive`` (``"from"``) event."""
    return {direction: peer, "kind": kind, "size": len(payload), "sha256": payload_sha256(payload).hex()}


def exchanged(direction: str, peer: str, kind: str, request: bytes, reply: bytes) -> dict[str, Any]:
    """Details of a ``call`` (``direction`` = ``"to"``: this party called ``peer``) or ``served``
    (``"from"``: it served ``peer``'s call) row: the request as :func:`message` gives it, and the
    reply's size and SHA-256 (its kind is ``kind + ".reply"``)."""
    return {**message(direction, peer, kind, request),
            "reply": {"size": len(reply), "sha256": payload_sha256(reply).hex()}}


def identity_fingerprint(identity_key: ed25519.Ed25519PublicKey) -> str:
    """The audit-log fingerprint (:func:`fedsec.audit.log.fingerprint`) of a certificate's identity key."""
    return fingerprint(identity_key.public_bytes_raw())


def head_problem(head: Any, *, actor: str, fingerprint: str, floor: int) -> str | None:
    """Why ``head`` (a peer's ``{actor, fingerprint, seq, hash}``) must not be acknowledged as the
    log of ``actor`` signed by the key of ``fingerprint`` at row ``floor`` or later; None if it may."""
    if not isinstance(head, dict):
        return "no head"
    seq, digest = head.get("seq"), head.get("hash")
    if (isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < SQLITE_INT
            or not isinstance(digest, str) or HEAD_HASH.fullmatch(digest) is None):
        return "malformed head"
    if head.get("actor") != actor:
        return f"head names {str(head.get('actor'))[:64]!r}, not {actor!r}"
    if head.get("fingerprint") != fingerprint:
        return f"head carries another key's fingerprint than {actor}'s certificate"
    if seq < floor:
        return f"head row {seq} is below row {floor}" + (" (an empty log after messages were exchanged)"
                                                         if seq == 0 else "")
    return None


class PartyAudit:
    """The audit log ``directory/audit.db`` of the party ``actor``, signed with its identity key.
    ``certificate`` (PEM), when given, is written beside it as ``ACTOR.crt``: what
    ``fedsec audit verify --ca`` binds the log's key to the actor with."""

    def __init__(self, directory: str | Path, *, actor: str, key: SigningKey, run_id: str,
                 certificate: bytes | None = None, linger: float = LINGER) -> None:
        if not 0 <= linger <= 10:
            raise ValueError("linger: must be between 0 and 10 seconds")
        self.actor, self.linger = actor, linger
        if certificate is not None:
            beside = Path(directory) / f"{actor}.crt"
            if not beside.exists() or beside.read_bytes() != certificate:
                beside.write_bytes(certificate)
        self._cond = threading.Condition()
        self._items: list[tuple[Any, Future | None] | None] = []
        """What the writer has to do, in the order it was asked (guarded by ``_cond``): message
        rows ``(rows, None)``, rows someone waits for ``(rows, future)``, work ``(callable, future)``
        and ``None`` (stop)."""
        self._urgent = False
        """Whether an item in ``_items`` is waited for (the writer starts at once)."""
        self._due, self._rows = 0.0, 0
        """When the oldest lingering item must be committed (monotonic seconds), and the rows in
        ``_items``."""
        self._failed: BaseException | None = None
        """The error of a queued batch that did not commit: every later call raises it."""
        self._thread = threading.Thread(target=self._write, name="audit-writer", daemon=True)
        self._thread.start()
        self._acked: dict[str, int] = {}
        self._ack_lock = threading.Lock()
        self.log: AuditLog = self._call(lambda: AuditLog(Path(directory) / LOG, actor=actor, key=key,
                                                         run_id=run_id))

    def _put(self, item: tuple[Any, Future | None] | None) -> None:
        """Hand ``item`` to the writer. The writer is woken only when it has something new to do:
        the first of a lingering batch (to start its clock), an item someone waits for, or
        :data:`MAX_LINGERING` rows; a message row queued behind others wakes nobody."""
        with self._cond:
            first = not self._items
            self._items.append(item)
            if first:
                self._due, self._rows = time.monotonic() + self.linger, 0
            rows = len(item[0]) if item is not None and isinstance(item[0], list) else 0
            full = self._rows < MAX_LINGERING <= self._rows + rows
            self._rows += rows
            urgent = item is None or item[1] is not None
            if urgent:
                self._urgent = True
            if first or urgent or full:
                self._cond.notify()

    def _take(self) -> list[tuple[Any, Future | None] | None]:
        """The writer's next batch, in order: everything asked for, once one item of it is waited
        for, :data:`MAX_LINGERING` rows wait, or the oldest has lingered ``linger`` seconds."""
        with self._cond:
            while True:
                if self._items:
                    left = self._due - time.monotonic()
                    if self._urgent or left <= 0 or self._rows >= MAX_LINGERING:
                        batch, self._items, self._urgent = self._items, [], False
                        return batch
                    self._cond.wait(left)
                else:
                    self._cond.wait()

    def _write(self) -> None:
        """The writer thread: everything in the order it was asked; message rows are committed with
        the next row or work someone waits for, or when they have lingered (see :data:`LINGER`)."""
        while True:
            pending: list[tuple[list[Item], Future | None]] = []
            for item in self._take():
                if item is None:
                    self._flush(pending)
                    return
                work, future = item
                if isinstance(work, list):
                    pending.append((work, future))
                    if future is not None:
                        self._flush(pending)  # someone waits for these rows (an event)
                        pending = []
                    continue
                self._flush(pending)  # a head, or closing: every row before it first
                pending = []
                assert future is not None
                if self._failed is not None and work != self.log.close:
                    future.set_exception(self._failed)
                    continue
                try:
                    future.set_result(work())
                except BaseException as error:  # noqa: BLE001 - handed to the caller
                    future.set_exception(error)
            self._flush(pending)

    def _flush(self, pending: list[tuple[list[Item], Future | None]]) -> None:
        if not pending:
            return
        if self._failed is None:
            try:
                self.log.append_many([item for items, _ in pending for item in items])
            except BaseException as error:  # noqa: BLE001 - every caller of the batch learns of it
                self._failed = error
        for _, future in pending:
            if future is None:
                continue
            if self._failed is not None:
                future.set_exception(self._failed)
            else:
                future.set_result(None)

    def _call(self, work: Callable[[], Any] | list[Item]) -> Any:
        future: Future = Future()
        self._put((work, future))
        return future.result()

    @staticmethod
    def _storable(items: list[Item]) -> None:
        """Raise ValueError (nothing queued) if a row could not be stored (:func:`row_problem`)."""
        for item in items:
            problem = row_problem(item)
            if problem is not None:
                raise ValueError(f"audit row refused: {problem}")

    def _queued(self, items: list[Item]) -> None:
        """Queue message rows without waiting (see the module's durability rule); raises ValueError,
        queueing nothing, for a row that could not be stored."""
        if self._failed is not None:
            raise self._failed
        self._storable(items)
        self._put((items, None))

    def event(self, action: str, *, round: int | None = None, stage: str | None = None,
              details: dict[str, Any] | None = None, peer_ref: str | None = None) -> None:
        """Record one event and wait until it is on disk; raises ValueError (nothing written, the
        log goes on) for a row that could not be stored (:func:`row_problem`)."""
        items = [(action, round, stage, details, peer_ref)]
        self._storable(items)
        self._call(items)

    def events(self, events: list[tuple[str, int | None, dict[str, Any]]]) -> None:
        """Record ``(action, round, details)`` events in order and wait once until all are on disk
        (one commit and fsync for all, not one each); ValueError, nothing written, as :meth:`event`."""
        items = [(action, round_, None, details, None) for action, round_, details in events]
        self._storable(items)
        self._call(items)

    def sent_then_received(self, peer: str, kind: str, request: bytes, reply: bytes, *,
                           round: int | None = None) -> None:
        """A call this party made: its request to ``peer`` and the reply, one ``call`` row (queued:
        see the module)."""
        self._queued([("call", round, None, exchanged("to", peer, kind, request, reply), None)])

    def received_then_sent(self, peer: str, kind: str, request: bytes, reply: bytes, *,
                           round: int | None = None) -> None:
        """A call this party served: ``peer``'s request and this party's reply, one ``served`` row
        (queued: see the module)."""
        self._queued([("served", round, None, exchanged("from", peer, kind, request, reply), None)])

    def head(self) -> dict[str, Any]:
        """This log's head, to hand to a peer (JSON)."""
        h = self._call(self.log.head)
        return {"actor": h.actor, "fingerprint": h.fingerprint, "seq": h.seq, "hash": h.hash}

    def ack_checked(self, head: Any, *, actor: str, fingerprint: str, round: int | None = None) -> str | None:
        """Acknowledge ``head`` only if it is the log of the party this one talks to (review
        findings R8, R9): it names ``actor`` (the peer's certificate name), carries ``fingerprint``
        (the audit fingerprint of the identity key in the peer's certificate), and its ``seq`` is
        at least 1 (messages were exchanged before any head is handed, so the peer's log is not
        empty) and not below a head of ``actor`` this object acknowledged before. Returns None when
        acknowledged, else the reason it was not (nothing is written; the caller records it)."""
        problem = head_problem(head, actor=actor, fingerprint=fingerprint,
                               floor=max(1, self._acked.get(actor, 0)))
        if problem is None:
            with self._ack_lock:
                self._acked[actor] = max(self._acked.get(actor, 0), int(head["seq"]))
            self.ack(head, round=round)
        return problem

    def ack(self, head: dict[str, Any], *, round: int | None = None) -> None:
        """Record a peer's head (the row :meth:`AuditLog.ack` writes); a malformed head is ignored.
        Queued like a message row: nothing this party sends depends on it."""
        try:
            peer = Head(str(head["actor"]), str(head["fingerprint"]), int(head["seq"]), str(head["hash"]))
        except (KeyError, TypeError, ValueError):
            return
        try:
            self._queued([("ack", round, None, {"actor": peer.actor, "fingerprint": peer.fingerprint,
                                                "seq": peer.seq, "hash": peer.hash}, peer.ref())])
        except ValueError:  # a row that could not be stored: ignored like any malformed head
            return

    def close(self) -> None:
        """Commit what is queued and close the log (raises the error of a batch that failed)."""
        try:
            self._call(self.log.close)
        finally:
            self._put(None)
            self._thread.join()
        if self._failed is not None:
            raise self._failed
