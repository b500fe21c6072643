"""Memory handed back between a run's steps (traceanalyzer/os_memory.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from traceanalyzer import os_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc")


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _given_back(allocate) -> tuple[int, int]:
    """RSS returned by give_back() under TRIM_MIN_BYTES, then above it, after `allocate`
    built ~240 MB and freed all but every 50th piece (so neither allocator can simply
    shrink from its end)."""
    pieces = allocate()
    keep = pieces[::50]
    del pieces
    held = _rss_bytes()
    os_memory.give_back(1)  # too little freed to be worth it: nothing happens
    small = held - _rss_bytes()
    os_memory.give_back(240 << 20)
    assert keep
    return small, held - _rss_bytes()


def test_freed_arrow_buffers_go_back_to_the_os():
    if pa.default_memory_pool().backend_name == "system":
        pytest.skip("Arrow allocates from malloc here: the malloc test covers it")
    small, big = _given_back(lambda: [pc.add(pa.array(np.arange(50_000)), 1) for _ in range(600)])
    assert small < 50 << 20 and big > 150 << 20


def test_freed_malloc_heap_goes_back_to_the_os():
    if os_memory._malloc_trim() is None:
        pytest.skip("malloc_trim is glibc's")
    small, big = _given_back(lambda: [bytes(4000) for _ in range(60_000)])
    assert small < 50 << 20 and big > 150 << 20
