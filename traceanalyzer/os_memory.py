"""Handing memory back to the operating system between the big steps of a run.

A big read builds its tables in Arrow, the store copies them into DuckDB, and they are
freed; then the rules' DuckDB work needs memory of its own. Freed memory that the process
keeps is memory DuckDB cannot use (it has its own allocator), so the peak of a whole
ingest + rules is what the read left behind *plus* what the rules need. On the 5 M-kernel
nsys export (bench/gen_big.py) the process held 2.4 GB after storing the run, with no Arrow
data alive, and peaked at 5.6 GB in the rules; after `give_back` it held 0.5 GB and peaked
at 3.5 GB. Two allocators keep freed memory:

* Arrow's pool (mimalloc on Linux wheels) keeps freed segments for its own reuse:
  `MemoryPool.release_unused()` returns them (~10 ms at that size).
* The C library's malloc (numpy, Python objects, small Arrow work) keeps free pages inside
  its heap: glibc's `malloc_trim(0)` returns them (elsewhere a no-op).

Switching Arrow to the system allocator had the same effect on memory, but every large
buffer then costs fresh page faults: readers build many, so the pool stays as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# Below this many bytes freed, giving back is not worth a walk over the heap.
TRIM_MIN_BYTES = 64 << 20

_libc = None


def give_back(freed_bytes: int = TRIM_MIN_BYTES) -> None:
    """Return the memory Arrow's pool and malloc keep after `freed_bytes` were released
    (nothing below TRIM_MIN_BYTES)."""
    if freed_bytes < TRIM_MIN_BYTES:
        return
    import pyarrow as pa

    try:
        pa.default_memory_pool().release_unused()
    except (AttributeError, NotImplementedError):  # an older pyarrow
        pass
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim():
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = lib if hasattr(lib, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc.malloc_trim if _libc else None
