"""Map a load's arrays into memory in a background thread while the rows stream in (Linux ``madvise``), so that
filling them does not stop at every first touch of a page.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
import threading
from typing import Any

import numpy as np

_MADV_POPULATE_WRITE = 23  # Linux >= 5.14: map pages writable (zeroed if new) without changing their contents
_PREFAULT_CHUNK = 8 << 20


def prefault_in_background(arrays: list[np.ndarray]) -> threading.Thread | None:
    """Map the pages of ``arrays`` in a thread (madvise MADV_POPULATE_WRITE, chunk by chunk from the start, the
    GIL released), so the loop that fills them rarely takes a page fault; None where Linux cannot. It never
    writes to the arrays: rows stored meanwhile are safe."""
    if not sys.platform.startswith("linux"):
        return None
    thread = threading.Thread(target=_populate, args=(arrays,), name="pgtrain-prefault", daemon=True)
    thread.start()
    return thread


def _populate(arrays: list[np.ndarray]) -> None:
    madvise = _libc_madvise()
    page = mmap.PAGESIZE
    for array in arrays:
        start, end = array.ctypes.data, array.ctypes.data + array.nbytes
        at = -(-start // page) * page
        while at + page <= end:
            size = min(_PREFAULT_CHUNK, (end - at) // page * page)
            if madvise(at, size, _MADV_POPULATE_WRITE) != 0:
                return  # an older kernel: the loop takes the faults itself
            at += size


@functools.cache
def _libc_madvise() -> Any:
    madvise = ctypes.CDLL(None, use_errno=True).madvise  # ctypes releases the GIL around the call
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise
