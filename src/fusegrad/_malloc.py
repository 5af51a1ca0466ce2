"""glibc malloc's thresholds, raised so that a training step's arrays reuse freed memory.

Where this sits: below everything; ``fusegrad/__init__.py`` calls ``tune()`` once, when
fusegrad is imported.

Why: numpy takes every array from ``malloc``.  glibc serves a request of 128 KiB or more by
``mmap`` (raising that threshold as such blocks are freed, up to 32 MiB) and gives the top of
its heap back to the system once more than a threshold of it is free.  A training step frees
most of its arrays at its end, so the next step maps and zero-fills the same megabytes again:
measured on the LSTM-LM's step in a process of its own (``benchmarks.programs``' workload, one
thread), about 2,100 page faults per compiled step against PyTorch's 270, and a fresh 3.4 MB
buffer cost 2.1 ms against 0.06 ms reused.  With both thresholds raised (blocks up to 32 MiB
from the heap, up to 128 MiB of free heap kept), whole steps took (ms, one thread, a process
each, before -> after): LSTM-LM 63.6 -> 57.4, MNIST-CNN 75.2 -> 70.4, DCGAN 38.0 -> 34.2, GPT
unchanged (5.6).  Raising only the trim threshold is worse than neither: it fixes the mmap
threshold at its 128 KiB start (LSTM-LM 85 ms, MNIST-CNN 127).

The cost: up to 128 MiB of freed memory stays with the process, as PyTorch's and JAX's
caching allocators keep theirs.  ``FUSEGRAD_MALLOC=keep`` leaves malloc as it is; so do
``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` set by the user (glibc reads them
itself), and any C library without glibc's ``mallopt``.
"""

from __future__ import annotations

import ctypes
import os
import sys

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold
TRIM_THRESHOLD = 128 << 20

_done: list[bool] = []


def tune() -> bool:
    """Raise glibc's mmap and trim thresholds (once per process); whether they were set."""
    if _done:
        return _done[0]
    _done.append(False)
    if not sys.platform.startswith("linux"):
        return False
    if os.environ.get("FUSEGRAD_MALLOC", "auto").strip() == "keep":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # the mmap threshold first: setting either turns glibc's dynamic adjustment off
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = ok and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    _done[0] = ok
    return ok
