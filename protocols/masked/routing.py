"""Routing the sealed share bundles from their senders to their recipients as byte slices.

Each client sends the server one sealed bundle per neighbour; the server forwards to each client
the bundles addressed to it, ordered by the sender's x-coordinate in the recipient's neighbourhood
(:meth:`protocols.masked.graph.RingGraph.neighbours` order), as ForwardedShares records
(sender id, bundle). Instead of one Python object per bundle, the router keeps every bundle as a
row of one byte matrix: the rows are sorted once by (recipient, x) and a recipient's message body
is one contiguous slice. The result is byte-identical to building
``ForwardedShares(tuple((v, sealed[v][c]) for v in graph.neighbours(c) if c in sealed.get(v, {})))``
for each recipient c (tests/protocols/masked checks this against that simple form).
"""

from __future__ import annotations

import struct

import numpy as np
from fedsec.protocols.masked import messages as m
from fedsec.protocols.masked.graph import RingGraph

_RECORD = np.dtype([("sender", ">u8"), ("bundle", f"V{m.SEALED_BYTES}")])
"""One ForwardedShares record as the wire lays it out: sender id (u64 big-endian), sealed bundle."""
_COUNT = struct.Struct(">I")


class BundleRouter:
    """Collects senders' bundles, then hands each recipient the body of its ForwardedShares.

    Args:
        graph: the round's ring and degree; every recipient must be a neighbour of its sender.
    """

    def __init__(self, graph: RingGraph) -> None:
        self.graph = graph
        self._senders: list[int] = []
        self._recipients: list[np.ndarray] = []
        self._blobs: list[bytes | np.ndarray] = []
        self._rows: np.ndarray | None = None
        self._starts: dict[int, tuple[int, int]] = {}

    def add(self, sender: int, recipients: np.ndarray, blobs: bytes) -> None:
        """Take ``sender``'s bundles: ``recipients`` (ids, one per bundle) and their bundles,
        ``SEALED_BYTES`` each, concatenated in the same order."""
        if self._rows is not None:
            raise RuntimeError("the router is already sealed")
        if len(blobs) != len(recipients) * m.SEALED_BYTES:
            raise ValueError("one sealed bundle of SEALED_BYTES per recipient")
        self._senders.append(sender)
        self._recipients.append(np.asarray(recipients, dtype=np.uint64))
        self._blobs.append(blobs)

    def add_rows(self, sender: int, rows: np.ndarray) -> None:
        """Take ``sender``'s bundles as the records of its ShareKeys (``messages.SEALED_ROW``:
        recipient id, bundle), without one Python object per bundle; equal to :meth:`add` with
        the recipients and the bundles concatenated."""
        if self._rows is not None:
            raise RuntimeError("the router is already sealed")
        if rows.dtype != m.SEALED_ROW:
            raise ValueError("rows must be SEALED_ROW records")
        self._senders.append(sender)
        self._recipients.append(rows["peer"].astype(np.uint64))
        self._blobs.append(rows["bundle"])

    def seal(self) -> None:
        """Sort every bundle taken by (recipient, x of its sender) once; no more can be added."""
        graph = self.graph
        counts = np.array([r.size for r in self._recipients], dtype=np.int64)
        total = int(counts.sum())
        rows = np.empty(total, dtype=_RECORD)  # one ForwardedShares record per bundle
        if total:
            senders = np.repeat(np.array(self._senders, dtype=np.uint64), counts)
            recipients = np.concatenate(self._recipients)
            rows["sender"] = senders
            rows["bundle"] = np.concatenate([np.frombuffer(b, dtype=_RECORD["bundle"]) if isinstance(b, bytes)
                                             else b for b in self._blobs])
            at = graph.positions(recipients)
            if bool((at < 0).any()):
                raise ValueError("a bundle is addressed to a client outside the ring")
            x = graph.x_at(at, graph.positions(senders))
            if bool((x == 0).any()):
                raise ValueError("a bundle is addressed to a client that is not a neighbour of its sender")
            order = np.lexsort((x, at))
            rows = rows[order]
            at = at[order]
            bounds = np.flatnonzero(np.diff(at)) + 1
            starts = np.concatenate(([0], bounds))
            ends = np.concatenate((bounds, [total]))
            ring = graph.ring
            self._starts = {ring[p]: (s, e) for p, s, e in zip(at[starts].tolist(), starts.tolist(),
                                                              ends.tolist(), strict=True)}
        self._rows = rows
        self._senders, self._recipients, self._blobs = [], [], []

    def body(self, recipient: int) -> list[bytes]:
        """The body of ``recipient``'s ForwardedShares message, as parts."""
        if self._rows is None:
            raise RuntimeError("seal the router first")
        start, end = self._starts.get(recipient, (0, 0))
        return [_COUNT.pack(end - start), self._rows[start:end].tobytes()]
