"""Which of the server's ``cryptography`` calls release the GIL (why its unmask stage needs processes).

A worker thread times each call while the main thread spins in Python. A call that releases the
GIL hands it to the spinning thread and, to return, must wait for it back: about the switch
interval (5 ms by default). A call that keeps the GIL returns in its own time. So the median call
beside the spinning thread is about its time alone when the GIL is held, and at least the switch
interval when it is released; the comparison does not depend on the machine's load.

    python -m benchmarks.gil_release

Last stdout line (JSON): the library version, the switch interval, and for each call (AES-256-CTR
``update_into`` of 4 kB, 400 kB (one mask of 100k words) and 4 MB, Ed25519 verify, X25519
exchange) the median seconds alone and beside the spinning thread and ``releases_gil``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import cryptography
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from benchmarks._common import emit

CALLS = 21


def _aes(nbytes: int) -> Callable[[], object]:
    zeros, out, key = bytes(nbytes), bytearray(nbytes + 15), os.urandom(32)
    return lambda: Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update_into(zeros, out)


def _ed25519() -> Callable[[], object]:
    key = Ed25519PrivateKey.generate()
    public, signature = key.public_key(), key.sign(b"message")
    return lambda: public.verify(signature, b"message")


def _x25519() -> Callable[[], object]:
    own, peer = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()
    return lambda: own.exchange(peer)


def median_seconds(call: Callable[[], object], *, beside_spinner: bool) -> float:
    """Median wall seconds of one call, alone or in a thread beside a main thread spinning in Python."""
    times: list[float] = []

    def work() -> None:
        for _ in range(CALLS):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)

    if not beside_spinner:
        work()
    else:
        worker = threading.Thread(target=work)
        worker.start()
        while worker.is_alive():
            pass
    return sorted(times)[CALLS // 2]


def main() -> None:
    interval = sys.getswitchinterval()
    results = {}
    for name, call in (("aes_ctr_4kB", _aes(4096)), ("aes_ctr_400kB", _aes(400_000)),
                       ("aes_ctr_4MB", _aes(4_000_000)), ("ed25519_verify", _ed25519()),
                       ("x25519_exchange", _x25519())):
        alone = median_seconds(call, beside_spinner=False)
        beside = median_seconds(call, beside_spinner=True)
        results[name] = {"alone_s": round(alone, 6), "beside_spinner_s": round(beside, 6),
                         "releases_gil": beside >= max(interval / 2, 2 * alone)}
    emit({"cryptography": cryptography.__version__, "switch_interval_s": interval, **results})


if __name__ == "__main__":
    main()
