"""The audit log of a ``fedsec run``: one party (``fedsec-run``), one ``audit.db`` per run directory.

What it records (the simulation has one process, so no message events: per round the upload
bytes and the digest of the model the released aggregate produced stand for them):

* ``run_start``: config SHA-256, seed, rounds, aggregation, DP mode; ``resume`` when
  ``--resume`` continues the run (from which round);
* per round, in one transaction: ``round`` (stage ``released`` or ``aborted``: upload bytes,
  participants, dropped, SHA-256 of the global model after the round), ``abort`` (the reason) or
  ``dropout`` (how many sampled clients are not in the sum) when they happen, and for a private
  run ``epsilon`` (the ledger entry: epsilon, delta, noise multiplier, sample rate, steps);
* ``run_end``: stop reason, rounds run, SHA-256 of the final model vector; ``model_saved``: the
  SHA-256 of ``model.pt``.

The signing key is the run's own Ed25519 key, created with the run and kept in ``audit.key``
(mode 0600) next to the log so that ``--resume`` can go on signing; its fingerprint is in
``summary.json`` and is printed by ``fedsec audit verify``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedsec.audit.log import AuditLog, read_events
from fedsec.fl_core.history import ResumePoint, RoundObserver, RoundRecord, TrainingResult
from fedsec.secagg.keys import SigningKey

ACTOR = "fedsec-run"
LOG = "audit.db"
KEY = "audit.key"
_LEDGER_KEYS = ("epsilon", "epsilon_rdp", "delta", "noise_multiplier", "sample_rate", "steps")


def vector_sha256(vector: np.ndarray) -> str:
    """SHA-256 of a parameter vector's float32 bytes (little-endian, C order)."""
    return hashlib.sha256(np.ascontiguousarray(vector, dtype="<f4").tobytes()).hexdigest()


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _key(directory: Path) -> SigningKey:
    """The run's key: read from ``audit.key`` or created there (mode 0600)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    path = directory / KEY
    if path.exists():
        private = bytes.fromhex(path.read_text().strip())
        public = Ed25519PrivateKey.from_private_bytes(private).public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw)
        return SigningKey(private, public)
    key = SigningKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key.private.hex() + "\n")
    return key


class RunAudit(RoundObserver):
    """Writes a run's events into ``directory/audit.db`` (continues an existing log on resume).

    Args:
        directory: the run directory (staging folder) that holds or will hold the log.
        model_vector: returns the global parameter vector after the round just run.
    """

    def __init__(self, directory: Path, *, model_vector: Callable[[], np.ndarray]) -> None:
        earlier = read_events(directory / LOG) if (directory / LOG).exists() else []
        run_id = earlier[0].run_id if earlier else secrets.token_hex(8)
        self.log = AuditLog(directory / LOG, actor=ACTOR, key=_key(directory), run_id=run_id)
        self._vector = model_vector

    def start(self, config_sha256: str, **details: Any) -> None:
        self.log.append("run_start", details={"config_sha256": config_sha256, **details})

    def on_resume(self, point: ResumePoint) -> None:
        self.log.append("resume", round=point.round, details={"from_round": point.round + 1,
                                                               "model_sha256": vector_sha256(point.vector)})

    def after_round(self, record: RoundRecord) -> None:
        r = record.round
        ok = record.status == "ok"
        items: list[tuple[str, int | None, str | None, dict[str, Any] | None, str | None]] = [
            ("round", r, "released" if ok else "aborted", {
                "upload_bytes": int(record.upload_bytes), "participants": int(record.participants),
                "dropped": int(record.dropped), "model_sha256": vector_sha256(self._vector())}, None)]
        if not ok:
            items.append(("abort", r, None, {"reason": record.status.removeprefix("aborted: ")}, None))
        elif record.dropped:
            items.append(("dropout", r, None, {"clients": int(record.dropped)}, None))
        if "epsilon" in record.metrics:
            items.append(("epsilon", r, None, {k: float(record.metrics[k]) for k in _LEDGER_KEYS
                                                if k in record.metrics}, None))
        self.log.append_many(items)

    def on_finish(self, result: TrainingResult) -> None:
        self.log.append("run_end", details={"stop_reason": result.stop_reason,
                                            "rounds_run": result.rounds_run,
                                            "model_sha256": vector_sha256(result.vector)})

    def model_saved(self, path: Path) -> str:
        """Record the SHA-256 of the saved ``model.pt``; returns it."""
        digest = file_sha256(path)
        self.log.append("model_saved", details={"file": path.name, "sha256": digest})
        return digest

    def summary(self) -> dict[str, Any]:
        head = self.log.head()
        return {"events": head.seq, "signer": ACTOR, "fingerprint": self.log.fingerprint,
                "head": head.hash}

    def close(self) -> None:
        self.log.close()
