"""A long-running party keeps the memory it frees instead of handing it back to the OS at every stage.

glibc's ``malloc`` serves a block of 128 KiB or more with its own ``mmap`` and unmaps it at
``free`` (raising that threshold as it sees such blocks freed, up to 32 MiB), and it gives the top
of its heap back to the OS once more than twice the threshold is free there. A deployed party
allocates and frees model-sized arrays at every stage (the encoded words, the masks, the model
vector: 0.4-0.8 MB each at 100k parameters), then sleeps until its next call: the memory goes back
to the OS and comes back as fresh zeroed pages, one page fault per 4 KiB touched. Measured on a
site process (issue 13's benchmark, 10 sites x 100k): 515 page faults in the first masking stage,
2.4 ms of CPU, where the simulation's clients, one after another in one process, took 123 and
0.75 ms; with this, 159 faults and 1.65 ms (docs/benchmarks.md, "Deployed round", third pass).

:func:`keep_freed_memory` pins glibc's thresholds (``mallopt``): blocks below
:data:`MMAP_THRESHOLD` come from the heap and freed memory stays there up to
:data:`TRIM_THRESHOLD`. The process's resident memory is then its peak heap use, which it reaches
at every stage anyway. Elsewhere than glibc (musl, macOS) nothing changes. ``fedsec join``,
``fedsec serve`` and ``fedsec keyholder`` call it at start.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter numbers (``malloc.h``)."""
MMAP_THRESHOLD = 32 << 20
"""Bytes: blocks at least this large are still mapped and unmapped on their own (glibc's own
ceiling for its dynamic threshold on 64-bit systems)."""
TRIM_THRESHOLD = 256 << 20
"""Bytes of free memory the heap's top may keep before glibc gives it back."""


def glibc() -> bool:
    """Whether this process runs on glibc (whose ``mallopt`` :func:`keep_freed_memory` sets)."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


def keep_freed_memory(*, mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds for this process (bytes, each in [128 KiB, 1 GiB]);
    returns True when both were set, False on another C library (nothing done).

    Raises:
        ValueError: a threshold out of range.
    """
    for key, value in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if isinstance(value, bool) or not isinstance(value, int) or not 128 << 10 <= value <= 1 << 30:
            raise ValueError(f"{key}: must be an integer number of bytes in [131072, 1073741824]")
    if not glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
