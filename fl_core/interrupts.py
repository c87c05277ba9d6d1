"""Ctrl-C between rounds, never inside the commit of one.

A round is committed when every observer has seen it (history, privacy ledger, checkpoint, audit)
and it is in the result. A SIGINT that lands in the middle of that (e.g. while the checkpoint
writer syncs its folder) would leave a checkpoint that says round r next to a result that ends
at r - 1. :func:`deferred_interrupt` holds the signal for the few milliseconds of the commit and
delivers it right after, so the round is either wholly in or wholly out.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold SIGINT while the block runs, then deliver it as the previous handler would.

    Outside the main thread (where Python cannot install handlers) the block runs unguarded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            signum, frame = pending[0]
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt
