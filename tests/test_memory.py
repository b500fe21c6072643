"""Memory handed back between a run's steps (traceanalyzer/memory.py)."""

from __future__ import annotations

import ctypes.util
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from traceanalyzer import memory
from traceanalyzer.ingest import read_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def arrow_pool():
    """Arrow's mimalloc pool as the default (its own default on Linux wheels); the original
    is put back after the test."""
    before = pa.default_memory_pool()
    try:
        pa.set_memory_pool(pa.mimalloc_memory_pool())
    except NotImplementedError:
        pytest.skip("this pyarrow is built without mimalloc")
    yield
    pa.set_memory_pool(before)


def test_readers_allocate_arrow_memory_from_malloc(arrow_pool, monkeypatch):
    monkeypatch.delenv(memory.ARROW_POOL_ENV, raising=False)
    read_file(FIXTURES / "kineto" / "planted.json")
    assert pa.default_memory_pool().backend_name == "system"


def test_a_pool_the_user_chose_is_left_alone(arrow_pool, monkeypatch):
    monkeypatch.setenv(memory.ARROW_POOL_ENV, "mimalloc")
    read_file(FIXTURES / "kineto" / "planted.json")
    assert pa.default_memory_pool().backend_name == "mimalloc"


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("c"),
                    reason="malloc_trim is glibc's")
def test_freed_heap_memory_goes_back_to_the_os():
    # 240 MB in malloc'd blocks, every 50th kept: the heap cannot shrink from its top, so
    # the freed pages stay with the process until they are trimmed.
    blocks = [bytes(4000) for _ in range(60_000)]
    keep = blocks[::50]
    del blocks
    held = _rss_bytes()
    memory.give_back(1)  # under TRIM_MIN_BYTES: not worth a walk over the heap
    assert held - _rss_bytes() < 50 << 20
    memory.give_back(240 << 20)
    assert held - _rss_bytes() > 150 << 20
    assert len(keep) == 1200
