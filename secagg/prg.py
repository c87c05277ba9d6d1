"""The mask PRG: AES-256 in counter mode, expanding a 32-byte key into a uniform vector mod 2^b.

Keys come from :func:`secagg.keys.derive_key`, so each (session, round, pair or owner, purpose)
gets its own AES key and the counter always starts at zero. Output words are 32-bit for moduli
up to 2^32 and 64-bit above; reducing them mod 2^b keeps them exactly uniform.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from fedsec.secagg.errors import InvalidArgumentError

_ZERO_IV = bytes(16)


def word_dtype(modulus_bits: int) -> np.dtype:
    """uint32 for 1 <= b <= 32, uint64 for 32 < b <= 64."""
    if not 1 <= modulus_bits <= 64:
        raise InvalidArgumentError(f"modulus bits must be in [1, 64], got {modulus_bits}")
    return np.dtype(np.uint32) if modulus_bits <= 32 else np.dtype(np.uint64)


class MaskExpander:
    """Expands keys into mask vectors of one fixed length and modulus, reusing its buffers."""

    def __init__(self, *, length: int, modulus_bits: int) -> None:
        if length < 1:
            raise InvalidArgumentError(f"mask length must be >= 1, got {length}")
        self.length = length
        self.modulus_bits = modulus_bits
        self.dtype = word_dtype(modulus_bits)
        self.nbytes = length * self.dtype.itemsize
        self._zeros = bytes(self.nbytes)
        self._buffer = bytearray(self.nbytes + 15)
        self._low_mask = self.dtype.type((1 << modulus_bits) - 1)
        self._reduce = modulus_bits not in (32, 64)

    def expand(self, key: bytes) -> np.ndarray:
        """A fresh uniform vector in [0, 2^b) of ``length`` words from a 32-byte key."""
        out = np.empty(self.length, dtype=self.dtype)
        self.expand_into(key, out)
        return out

    def _keystream(self, key: bytes) -> np.ndarray:
        """The raw AES-CTR keystream of ``key`` as words (a view of the reused buffer)."""
        encryptor = Cipher(algorithms.AES(key), modes.CTR(_ZERO_IV)).encryptor()
        encryptor.update_into(self._zeros, self._buffer)
        return np.frombuffer(self._buffer, dtype=self.dtype, count=self.length)

    def expand_into(self, key: bytes, out: np.ndarray) -> None:
        """Write the mask of ``key`` into ``out`` (a ``length`` vector of the word dtype)."""
        out[:] = self._keystream(key)
        if self._reduce:
            np.bitwise_and(out, self._low_mask, out=out)

    def add_into(self, key: bytes, acc: np.ndarray, *, sign: int) -> None:
        """acc += sign * mask(key) mod 2^word (the caller reduces mod 2^b at the end)."""
        mask = self._keystream(key)
        if sign > 0:
            np.add(acc, mask, out=acc)
        else:
            np.subtract(acc, mask, out=acc)


_SWITCH_INTERVAL = 1e-4
"""Seconds between forced GIL hand-offs while a :class:`MaskSum` overlaps its workers with a caller
that holds the GIL (key agreement): a worker done with one AES-CTR call waits at most about this
long to start the next, instead of Python's default 5 ms."""


_overlap_lock = threading.Lock()
_overlaps = 0
_saved_interval = 0.0


def _lower_switch_interval() -> None:
    """Lower the switch interval while at least one MaskSum has workers (nested or concurrent
    sums in several threads restore the original value only when the last one ends)."""
    global _overlaps, _saved_interval
    with _overlap_lock:
        if _overlaps == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved_interval, _SWITCH_INTERVAL))
        _overlaps += 1


def _restore_switch_interval() -> None:
    global _overlaps
    with _overlap_lock:
        _overlaps -= 1
        if _overlaps == 0:
            sys.setswitchinterval(_saved_interval)


@contextmanager
def quick_switches() -> Iterator[None]:
    """Lower the interpreter's switch interval to ``_SWITCH_INTERVAL`` for the block (restored
    when the last of the overlapping blocks ends, also on an exception): another thread of this
    process waiting for the GIL (a process pool's hand-off threads, a :class:`MaskSum` worker)
    gets it within about that long while this one computes, instead of Python's default 5 ms."""
    _lower_switch_interval()
    try:
        yield
    finally:
        _restore_switch_interval()


class MaskSum:
    """Sum of sign * mask(key) over keys handed in one at a time, expanded by worker threads while
    the caller derives the next keys (mod 2^word; the caller reduces mod 2^b at the end).

    ``threads - 1`` workers (default threads: min(4, cores)) expand the keys already given while
    the caller's thread computes the next ones. Only numpy's additions release the GIL (AES-CTR in
    ``cryptography`` 50.0.2 keeps it: ``python -m benchmarks.gil_release``), so the threads overlap
    the additions, not two expansions; more cores need processes (``protocols.masked.workers``);
    :meth:`finish` has the caller's thread join the expansion of what is left. Each thread adds into
    its own accumulator; keys pass through one C-level FIFO (no per-item Python hand-off). While
    the workers run, the interpreter's switch interval is lowered to ``_SWITCH_INTERVAL`` (and
    restored on exit) so that a worker is not kept from its next AES call by a caller that holds
    the GIL. Use as a context manager: leaving it, normally or by an exception, stops and joins
    every worker.

    Args:
        length: words per mask, >= 1.
        modulus_bits: b in [1, 64] (words are uint32 for b <= 32, uint64 above).
        threads: threads expanding masks, the caller's included, >= 1.
    """

    def __init__(self, *, length: int, modulus_bits: int, threads: int | None = None) -> None:
        self.dtype = word_dtype(modulus_bits)
        if length < 1:
            raise InvalidArgumentError(f"mask length must be >= 1, got {length}")
        count = threads if threads is not None else min(4, os.cpu_count() or 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidArgumentError(f"threads must be an integer >= 1, got {threads!r}")
        self.length, self.modulus_bits, self.threads = length, modulus_bits, count
        self._queue: queue.SimpleQueue[tuple[bytes, int] | None] = queue.SimpleQueue()
        self._sums: list[np.ndarray] = []
        self._workers: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._cancelled = False
        self._lowered = False
        self._open = False

    def __enter__(self) -> MaskSum:
        if self.threads > 1:
            _lower_switch_interval()
            self._lowered = True
        for _ in range(self.threads - 1):
            acc = np.zeros(self.length, dtype=self.dtype)
            self._sums.append(acc)
            worker = threading.Thread(target=self._work, args=(acc,), daemon=True)
            self._workers.append(worker)
            worker.start()
        self._open = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._cancelled = exc[0] is not None
        self._stop()

    def add(self, key: bytes, sign: int) -> None:
        """Queue ``sign`` (+1 or -1) times the mask of the 32-byte ``key``."""
        if not self._open:
            raise RuntimeError("MaskSum is not open (use it as a context manager, before finish)")
        if sign not in (1, -1):
            raise InvalidArgumentError(f"sign must be +1 or -1, got {sign!r}")
        self._queue.put((key, sign))

    def finish(self) -> np.ndarray:
        """Expand what is left on the caller's thread too, join the workers and return the sum."""
        if not self._open:
            raise RuntimeError("MaskSum is not open (use it as a context manager, once)")
        acc = np.zeros(self.length, dtype=self.dtype)
        for _ in self._workers:
            self._queue.put(None)  # after every key: FIFO, so each worker ends once the keys are taken
        expander = MaskExpander(length=self.length, modulus_bits=self.modulus_bits)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:  # the workers took the rest and their end markers
                break
            if item is None:  # a worker's end marker: every key before it is taken
                self._queue.put(None)
                break
            expander.add_into(item[0], acc, sign=item[1])
        self._stop()
        if self._errors:
            raise self._errors[0]
        for other in self._sums:
            np.add(acc, other, out=acc)
        return acc

    def _stop(self) -> None:
        if not self._open:
            return
        self._open = False
        if self._cancelled:
            for _ in self._workers:
                self._queue.put(None)
        for worker in self._workers:
            worker.join()
        if self._lowered:
            _restore_switch_interval()
            self._lowered = False

    def _work(self, acc: np.ndarray) -> None:
        expander = MaskExpander(length=self.length, modulus_bits=self.modulus_bits)
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                if not self._cancelled:
                    expander.add_into(item[0], acc, sign=item[1])
        except BaseException as error:  # surfaced in the caller's thread by finish
            self._errors.append(error)
            self._cancelled = True
            while self._queue.get() is not None:  # keep taking until this worker's end marker
                pass


def accumulate_masks(
    items: Iterable[tuple[bytes, int]], *, length: int, modulus_bits: int, threads: int | None = None
) -> np.ndarray:
    """Sum of sign * mask(key) over ``items`` (mod 2^word), expanded on ``threads`` threads (the
    caller's included; default min(4, cores)) by a :class:`MaskSum`. The caller reduces the result."""
    items = list(items)
    with MaskSum(length=length, modulus_bits=modulus_bits,
                 threads=threads if len(items) >= 8 else 1) as masks:
        for key, sign in items:
            masks.add(key, sign)
        return masks.finish()
