"""Make the C allocator give large freed buffers back, so the coordinator's memory stays bounded.

Uploads arrive as 1 MiB chunks and multi-megabyte vectors, on hundreds of gRPC threads. glibc's
defaults serve them badly here: after the first large buffer is freed it raises its mmap
threshold (up to 32 MiB), so later ones come from per-thread arenas (up to 8 per core) whose
freed space is kept, not returned. In the 200-silo benchmark (bench/secagg_scale.py) that kept
about 370 MB resident for nothing. Fixing the threshold at 256 KiB and the arenas at 2 returns
every large buffer on free; the benchmark's input stage took no longer. Elsewhere than glibc
(musl, macOS) nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_MMAP_THRESHOLD = -3      # glibc's mallopt parameter numbers (malloc.h)
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 256 << 10
ARENAS = 2


def return_large_buffers() -> bool:
    """Set glibc's mmap threshold and arena count; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version   # noqa: B018 -- only glibc has it
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_ARENA_MAX, ARENAS))
