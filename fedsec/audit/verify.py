"""Check one audit log: header, sequence, JSON, hash chain, signatures (``fedsec audit verify``).

What a valid log proves, and to whom: nobody without the signer's private key changed, inserted,
removed or reordered a row after it was written, except for dropping rows at the end (a valid
prefix verifies). Dropped tails are caught by a peer's acknowledgement
(:func:`check_ack`, used by :func:`fedsec.audit.reconcile.reconcile`). The signer itself can
rewrite its whole log with its own key; a peer's ``ack`` rows and, in a deployment, a certificate
that binds the key to the party are what stop that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fedsec.audit.log import (
    FORMAT,
    Event,
    Head,
    canonical_json,
    fingerprint,
    genesis,
    read_events,
    read_header,
    row_hash,
)
from fedsec.secagg.errors import CryptoError
from fedsec.secagg.keys import verify as verify_signature


class LogBroken(Exception):
    """The log fails a check; ``seq`` is the first bad row (0: the header), ``reason`` what is wrong."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"row {seq}: {reason}" if seq else f"header: {reason}")
        self.seq, self.reason = seq, reason


@dataclass(frozen=True)
class Verified:
    """A log that passed every check."""

    events: int
    actor: str
    fingerprint: str
    head: Head


def verify_log(path: str | Path) -> Verified:
    """Check the log at ``path`` row by row; returns its size and signer.

    Raises:
        ValueError: (key ``path``) no such file, or not a SQLite audit log at all.
        LogBroken: the first row (or the header) that fails, and why.
    """
    header = read_header(path)
    events = read_events(path)
    public = _check_header(header)
    actor, fp = header["actor"], header["fingerprint"]
    previous = genesis(actor, header["public_key"])
    for expected, event in enumerate(events, start=1):
        _check_row(event, expected, previous, actor, fp, public)
        previous = event.hash
    return Verified(len(events), actor, fp, Head(actor, fp, len(events), previous))


def _check_header(header: dict[str, str]) -> bytes:
    if header.get("format") != FORMAT:
        raise LogBroken(0, f"format {header.get('format')!r}, expected {FORMAT!r}")
    for key in ("actor", "public_key", "fingerprint"):
        if not header.get(key):
            raise LogBroken(0, f"{key} missing")
    try:
        public = bytes.fromhex(header["public_key"])
    except ValueError:
        raise LogBroken(0, "public_key is not hex") from None
    if len(public) != 32:
        raise LogBroken(0, "public_key is not a 32-byte Ed25519 key")
    if fingerprint(public) != header["fingerprint"]:
        raise LogBroken(0, "fingerprint does not match public_key")
    return public


def _check_row(event: Event, expected: int, previous: str, actor: str, fp: str, public: bytes) -> None:
    seq = event.seq
    if seq != expected:
        raise LogBroken(seq, f"sequence gap: expected row {expected}, found row {seq}")
    try:
        details = json.loads(event.details)
    except (json.JSONDecodeError, TypeError):
        raise LogBroken(seq, "bad JSON in details") from None
    if not isinstance(details, dict) or canonical_json(details) != event.details:
        raise LogBroken(seq, "details are not a canonical JSON object")
    if event.actor != actor:
        raise LogBroken(seq, f"actor {event.actor!r}, the header says {actor!r}")
    if event.key_fp != fp:
        raise LogBroken(seq, f"signed by another key (fingerprint {event.key_fp[:16]}..., the header's "
                             f"is {fp[:16]}...)")
    if event.prev_hash != previous:
        raise LogBroken(seq, "hash chain broken: prev_hash is not the previous row's hash")
    if row_hash(event) != event.hash:
        raise LogBroken(seq, "hash does not match the row's contents")
    try:
        verify_signature(public, bytes.fromhex(event.signature), bytes.fromhex(event.hash))
    except (CryptoError, ValueError):
        raise LogBroken(seq, "signature does not verify with the header's key") from None


def check_ack(path: str | Path, head: Head) -> None:
    """Check that the log at ``path`` (already verified) still holds an acknowledged ``head``.

    Raises:
        LogBroken: the acknowledged row is missing (tail truncated) or differs (rewritten).
    """
    if head.seq == 0:
        return
    rows = [e for e in read_events(path) if e.seq == head.seq]
    if not rows:
        raise LogBroken(head.seq, f"missing: a peer acknowledged row {head.seq} (tail truncated)")
    if rows[0].hash != head.hash:
        raise LogBroken(head.seq, "differs from the hash a peer acknowledged (log rewritten)")
