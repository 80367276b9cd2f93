"""Returning a silo's freed set-up memory to the operating system.

Loading a dataset and computing its structure embeddings allocates many small tensors that are
freed once the trainer has packed its splits (silo/models/batching.py). glibc keeps such freed heap
pages in the process: on DD a silo stays at 1.0 GB resident where 0.56 GB are in use. Asking
glibc to trim its heap once, after set-up, gives them back.
"""

from __future__ import annotations

import ctypes
import gc


def return_freed_memory() -> None:
    """Collect garbage, then release free heap pages to the OS (a no-op without glibc)."""
    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)
