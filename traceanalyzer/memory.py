"""Handing memory back to the operating system between the big steps of a run.

A big read builds its tables in Arrow, the store copies them into DuckDB, and they are
freed; then the rules' DuckDB work needs memory of its own. Freed memory that the process
keeps is memory DuckDB cannot use (it has its own allocator), so the peak of a whole
ingest + rules is what the read left behind *plus* what the rules need. On the 5 M-kernel
nsys export (bench/gen_big.py) the process held 2.4 GB after storing the run, with 0 bytes
of Arrow data alive, and peaked at 5.6 GB in the rules; with the two steps below it held
0.6 GB and peaked at 3.8 GB, for the same time:

* Arrow allocates from the C library's malloc (`pyarrow.system_memory_pool`) instead of its
  bundled mimalloc, which keeps freed segments for its own reuse. glibc hands large
  blocks straight back on free. Set `ARROW_DEFAULT_MEMORY_POOL` (`mimalloc`, `jemalloc`,
  `system`) to choose yourself; it is then left alone.
* After storing a big run, `malloc_trim(0)` returns the free pages inside the heap too
  (glibc only; elsewhere a no-op).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
# Below this many bytes of tables, trimming is not worth the walk over the heap.
TRIM_MIN_BYTES = 64 << 20

_libc = None


def use_system_arrow_pool() -> None:
    """Make Arrow allocate from malloc, unless the user chose a pool (see the module doc).

    Safe at any time: each buffer is freed by the pool that allocated it."""
    if os.environ.get(ARROW_POOL_ENV):
        return
    import pyarrow as pa

    try:
        pool = pa.system_memory_pool()
        if pa.default_memory_pool().backend_name != pool.backend_name:
            pa.set_memory_pool(pool)
    except (AttributeError, NotImplementedError, pa.ArrowException):
        pass


def give_back(freed_bytes: int = TRIM_MIN_BYTES) -> None:
    """Return free heap pages to the OS after `freed_bytes` were released (glibc's
    malloc_trim; nothing on other C libraries or below TRIM_MIN_BYTES)."""
    global _libc
    if freed_bytes < TRIM_MIN_BYTES:
        return
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = lib if hasattr(lib, "malloc_trim") else False
        except OSError:
            _libc = False
    if _libc:
        _libc.malloc_trim(0)
