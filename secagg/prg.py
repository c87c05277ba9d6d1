"""The mask PRG: AES-256 in counter mode, expanding a 32-byte key into a uniform vector mod 2^b.

Keys come from :func:`secagg.keys.derive_key`, so each (session, round, pair or owner, purpose)
gets its own AES key and the counter always starts at zero. Output words are 32-bit for moduli
up to 2^32 and 64-bit above; reducing them mod 2^b keeps them exactly uniform.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

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


def accumulate_masks(
    items: Iterable[tuple[bytes, int]], *, length: int, modulus_bits: int, threads: int | None = None
) -> np.ndarray:
    """Sum of sign * mask(key) over ``items`` (mod 2^word), expanded on ``threads`` threads.

    AES-CTR and numpy additions release the GIL, so the threads (the caller's and ``threads - 1``
    workers; default min(4, cores)) run in parallel, each taking the next item from one shared list
    and adding into its own accumulator: no queue, no per-item hand-off. Pass keys that are already
    derived (key agreement holds the GIL and would stall them). The result is reduced by the caller.
    """
    workers = max(1, threads if threads is not None else min(4, os.cpu_count() or 1))
    items = list(items)
    dtype = word_dtype(modulus_bits)
    if workers == 1 or len(items) < 8:
        acc = np.zeros(length, dtype=dtype)
        expander = MaskExpander(length=length, modulus_bits=modulus_bits)
        for key, sign in items:
            expander.add_into(key, acc, sign=sign)
        return acc
    pending = iter(items)
    lock = threading.Lock()
    sums = [np.zeros(length, dtype=dtype) for _ in range(workers)]
    errors: list[BaseException] = []

    def work(acc: np.ndarray) -> None:
        expander = MaskExpander(length=length, modulus_bits=modulus_bits)
        try:
            while True:
                with lock:
                    item = next(pending, None)
                if item is None:
                    return
                expander.add_into(item[0], acc, sign=item[1])
        except BaseException as error:  # surfaced in the caller's thread
            errors.append(error)

    pool = [threading.Thread(target=work, args=(acc,), daemon=True) for acc in sums[1:]]
    for t in pool:
        t.start()
    work(sums[0])
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    total = sums[0]
    for other in sums[1:]:
        np.add(total, other, out=total)
    return total
