"""The server's deferred checks: the stages' Ed25519 signatures and the unmask answers' share hashes,
computed in batches by the :class:`~protocols.masked.workers.WorkerPool`'s processes and the server
while the server reads a stage's later messages.

A batch goes to a worker while the workers hold fewer than
:data:`~protocols.masked.workers.IN_FLIGHT` batches each; a batch the workers have no room for is
computed by the server at once. What travels to a worker is what the server received (public keys,
signatures, messages; share rows), pickled by the server; what comes back is one byte a signature
verdict or 32 bytes a share hash, read as bytes, never an object a peer could shape. A worker that
dies, answers anything else, or does not answer within
:data:`~protocols.masked.workers.HUNG_AFTER_S` raises
:class:`~protocols.masked.workers.WorkerError` and breaks its pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import NoReturn

import numpy as np
from fedsec.protocols.masked import workers
from fedsec.protocols.masked.keys import COMMITMENT_BYTES, ShareHasher
from fedsec.protocols.masked.workers import WorkerError, WorkerPool
from fedsec.secagg import keys as crypto
from fedsec.secagg.errors import CryptoError

SIGNATURE_BATCH = 64
"""Signature checks sent to a worker at a time."""
HASH_BATCH = 32
"""Unmask answers whose share hashes are sent to a worker at a time."""


def verify_batch(items: Sequence[tuple[bytes, bytes, bytes]]) -> bytes:
    """One byte per (public key, signature, message): 1 if the Ed25519 signature verifies, else 0.
    Runs in a worker process or in the server's own."""
    verdicts = bytearray(len(items))
    for i, (public, signature, message) in enumerate(items):
        try:
            crypto.verify(public, signature, message)
        except CryptoError:
            continue
        verdicts[i] = 1
    return bytes(verdicts)


Check = tuple[bytes, bytes, bytes]
"""(Ed25519 public key, signature, message)."""


class DeferredSignatures:
    """The Ed25519 checks of one stage, verified by the pool's workers and the server while the
    server reads the stage's later messages. Each check carries its sender and a payload (what the
    server applies once the signature is known good); :meth:`ready` hands back the checks already
    verified, :meth:`finish` every check left.

    Checks are taken in batches of ``batch``. A full batch goes to a worker while the workers hold
    fewer than ``workers.IN_FLIGHT`` batches each (one verifying, one waiting, so a worker never
    waits for the server's next hand-off); otherwise it waits in a queue for the next free place,
    and a batch beyond ``workers.IN_FLIGHT`` queued ones the server verifies itself at once (which
    bounds the payloads held). At the end the server verifies the queued batches itself, newest first, while
    the workers verify the ones they hold and take the oldest queued ones as places free up, and
    the last partial batch; then it waits for the batches sent.
    """

    def __init__(self, pool: WorkerPool, *, batch: int | None = None) -> None:
        self.pool, self.batch = pool, batch or SIGNATURE_BATCH
        self._pending: list[tuple[int, object, Check]] = []
        self._queued: list[list[tuple[int, object, Check]]] = []
        """Full batches waiting for a place in a worker, oldest first."""
        self._local: list[tuple[int, object, bool]] = []
        """Verified by the server itself, not yet handed back."""
        self._sent: list[tuple[list[tuple[int, object]], list[Check], Future]] = []
        self._error: WorkerError | None = None
        self._room = workers.IN_FLIGHT * (pool.workers - 1)

    def add(self, sender: int, public: bytes, signature: bytes, message: bytes,
            payload: object = None) -> None:
        """Queue the check of ``sender``'s signature on ``message``."""
        self._pending.append((sender, payload, (public, signature, message)))
        if len(self._pending) < self.batch:
            return
        batch, self._pending = self._pending, []
        if self._error is not None:
            return
        self._queued.append(batch)
        self._send()
        if len(self._queued) > workers.IN_FLIGHT:
            self._local += self._here(self._queued.pop())

    def _send(self) -> None:
        """Hand the oldest queued batches to the workers while they have room."""
        while self._queued and self._error is None:
            if sum(not future.done() for _, _, future in self._sent) >= self._room:
                return
            batch = self._queued.pop(0)
            tagged = [(c, payload) for c, payload, _ in batch]
            items = [item for _, _, item in batch]
            try:
                self._sent.append((tagged, items, self.pool._submit(verify_batch, items)))
            except WorkerError as error:  # raised by ready/finish: never from the server's receive
                self._error = error

    @staticmethod
    def _here(batch: list[tuple[int, object, Check]]) -> list[tuple[int, object, bool]]:
        verdicts = verify_batch([item for _, _, item in batch])
        return [(c, payload, bool(ok)) for (c, payload, _), ok in zip(batch, verdicts, strict=True)]

    def ready(self, *, keep: int = 4) -> list[tuple[int, object, bool]]:
        """(sender, payload, verified) of the checks already verified (here, or in sent batches,
        oldest first), waiting for the oldest sent batch while more than ``keep`` are outstanding
        (bounds the payloads held)."""
        out, self._local = self._local, []
        try:
            while self._error is None and self._sent and (self._sent[0][2].done() or len(self._sent) > keep):
                tagged, _, future = self._sent.pop(0)
                out += self._verdicts(tagged, future)
        except WorkerError as error:  # raised by finish: never from the server's receive
            self._error = error
        self._send()
        return out

    def finish(self) -> list[tuple[int, object, bool]]:
        """(sender, payload, verified) of every check not yet handed back.

        Raises:
            WorkerError: a worker died or answered something other than one verdict per check.
        """
        if self._error is not None:
            self._drop()
            raise self._error
        while self._queued and self._error is None:  # the workers take the oldest, the server the newest
            self._send()
            if self._queued:
                self._local += self._here(self._queued.pop())
        if self._error is not None:
            self._drop()
            raise self._error
        out, self._local = self._local, []
        if self._pending:
            out += self._here(self._pending)
            self._pending = []
        # The batches sent are waited for, never cancelled: on Python 3.11 a pool that breaks with
        # a cancelled future pending stops failing the others, and a wait on them would hang.
        sent, self._sent = self._sent, []
        for tagged, _, future in sent:
            out += self._verdicts(tagged, future)
        return out

    def failed(self) -> list[int]:
        """:meth:`finish`, for checks without payloads: the senders whose signature failed."""
        return sorted(c for c, _, ok in self.finish() if not ok)

    def _verdicts(self, tagged: list[tuple[int, object]], future: Future) -> list[tuple[int, object, bool]]:
        try:
            answer = future.result(timeout=workers.HUNG_AFTER_S)
        except TimeoutError:
            self._broken(f"no answer within {workers.HUNG_AFTER_S:g} s")
        except Exception as error:  # BrokenProcessPool, or anything the worker raised
            self._broken(type(error).__name__)
        if not isinstance(answer, bytes) or len(answer) != len(tagged) or set(answer) - {0, 1}:
            self._broken("not one verdict per signature")
        return [(c, payload, bool(ok)) for (c, payload), ok in zip(tagged, answer, strict=True)]

    def _broken(self, why: str) -> NoReturn:
        self._drop()
        self.pool._fail()
        raise WorkerError(f"a worker process failed ({why}); nothing released")

    def _drop(self) -> None:
        # Dropped, not cancelled: the pool is broken, and its manager thread fails every pending
        # future itself (on Python 3.11 it raises InvalidStateError on one already cancelled).
        self._sent, self._pending, self._local, self._queued = [], [], [], []


ShareRows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One unmask answer's shares: owners (uint64), x-coordinates, kinds (int64), shares (n x 33 uint8)."""


def hash_rows(session: bytes, round_index: int, answers: Sequence[ShareRows]) -> bytes:
    """The share hashes (:func:`protocols.masked.keys.share_hash`) of every share of ``answers``, 32
    bytes each, in order. Runs in a worker process or in the server's own."""
    if not answers:
        return b""
    owners, xs, kinds, shares = (np.concatenate(column) for column in zip(*answers, strict=True))
    return ShareHasher(session, round_index).digest_rows(owners, xs, kinds, shares).tobytes()


class DeferredHashes:
    """The share hashes of the unmask answers, computed by the pool's workers and the server while
    the server reads the later answers (the same sharing as :class:`DeferredSignatures`: a batch of
    ``batch`` answers goes to a worker while the workers hold fewer than ``workers.IN_FLIGHT``
    batches each, otherwise the server hashes it at once). :meth:`finish` hands back every answer's tag
    with its hashes as an (n, 32) uint8 array, row i the hash of share i.
    """

    def __init__(self, pool: WorkerPool, *, session: bytes, round_index: int,
                 batch: int | None = None) -> None:
        self.pool, self.batch = pool, batch or HASH_BATCH
        self.session, self.round_index = session, round_index
        self._pending: list[tuple[object, ShareRows]] = []
        self._done: list[tuple[list[tuple[object, ShareRows]], bytes | Future]] = []
        self._room = workers.IN_FLIGHT * (pool.workers - 1)
        self._error: WorkerError | None = None

    def add(self, tag: object, rows: ShareRows) -> None:
        """Queue the hashes of one answer's shares."""
        self._pending.append((tag, rows))
        if len(self._pending) < self.batch:
            return
        batch, self._pending = self._pending, []
        answers = [rows for _, rows in batch]
        busy = sum(isinstance(done, Future) and not done.done() for _, done in self._done)
        if self._error is None and busy < self._room:
            try:
                future = self.pool._submit(hash_rows, self.session, self.round_index, answers)
                self._done.append((batch, future))
                return
            except WorkerError as error:  # raised by finish: never from the server's receive
                self._error = error
        self._done.append((batch, hash_rows(self.session, self.round_index, answers)))

    def finish(self) -> list[tuple[object, np.ndarray]]:
        """Every answer's (tag, hashes), in the order added.

        Raises:
            WorkerError: a worker died, answered something other than one hash per share, or did
                not answer within ``workers.HUNG_AFTER_S`` seconds.
        """
        if self._pending:
            batch, self._pending = self._pending, []
            self._done.append((batch, hash_rows(self.session, self.round_index, [rows for _, rows in batch])))
        done, self._done = self._done, []
        if self._error is not None:
            raise WorkerError(f"unmask: {self._error}")
        out: list[tuple[object, np.ndarray]] = []
        for batch, result in done:  # waited for, never cancelled (see DeferredSignatures.finish)
            sizes = [len(rows[0]) for _, rows in batch]
            if isinstance(result, Future):
                result = _answer(self.pool, result)
            if not isinstance(result, bytes) or len(result) != COMMITMENT_BYTES * sum(sizes):
                self.pool._fail()
                raise WorkerError("unmask: a worker process failed (not one hash per share); nothing "
                                  "released")
            hashes = np.frombuffer(result, dtype=np.uint8).reshape(-1, COMMITMENT_BYTES)
            start = 0
            for (tag, _), size in zip(batch, sizes, strict=True):
                out.append((tag, hashes[start:start + size]))
                start += size
        return out


def _answer(pool: WorkerPool, future: Future) -> object:
    """A sent batch of share hashes' answer, waited for at most ``workers.HUNG_AFTER_S`` seconds
    (WorkerError otherwise)."""
    try:
        return future.result(timeout=workers.HUNG_AFTER_S)
    except TimeoutError:
        why = f"no answer within {workers.HUNG_AFTER_S:g} s"
    except Exception as error:  # BrokenProcessPool, or anything the worker raised
        why = type(error).__name__
    pool._fail()
    raise WorkerError(f"unmask: a worker process failed ({why}); nothing released")
