"""What a scan worker does to one file, wherever it runs: a process of the local pool
(`scan.local_outcomes`) or a dask worker (`distributed.dask_outcomes`).

`process_file` is `check.check_file` on a store of the worker's own (this thread's in-memory
scratch store; a store file for a big streamed nsys export), then the run's rows and per-run
findings read back for the writer (`FileOutcome`). `scan.py` and `distributed.py` both hand
files to it; it imports neither (an import-linter contract in pyproject.toml says so).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .. import interrupt, os_memory
from ..ingest import ParsedTrace, streams
from ..resources import Resources
from ..rules.engine import Settings
from ..store import DEFAULT_HASH, RuleResults, Store
from .check import FileResult, check_file


class ScanError(Exception):
    """The scan cannot start (no files, no dask, cannot reach the scheduler)."""


@dataclass
class WorkContext:
    """What every worker needs besides the path: shipped once per worker, not per file."""

    up_to_date: frozenset[str]  # content already stored with current findings: skip
    settings: Settings | None  # None: store runs without evaluating rules
    resources: Resources = field(default_factory=lambda: Resources(1))  # each worker's share
    hash_name: str = DEFAULT_HASH  # the writer's store's content hash (`Store.hash_name`)
    # A file at least this big whose reader streams (nsys) is checked on a store file of the
    # worker's own instead of in memory (None: never). Only a dask worker meets such files:
    # a local scan leaves them to the writer.
    stream_min_bytes: int | None = None


@dataclass
class FileOutcome:
    """A worker's answer for one file: what `check_file` did on the worker's store, and for a
    run read now, its rows and per-run findings for the writer."""

    result: FileResult
    trace: ParsedTrace | None = None
    findings: RuleResults | None = None

    @classmethod
    def failed(cls, path: str, error: str) -> FileOutcome:
        return cls(FileResult(path, error=error))


_local = threading.local()  # one scratch store per worker thread (DuckDB connections are not shared)

# An in-memory DuckDB table never gives back the room of its deleted rows (nothing is ever
# checkpointed), so a scratch store grew by every run it had checked, and its rules scanned
# the dead rows too: 40 checks of a 124 KB Kineto trace (4.8 k rows) took it from 6 to 68 MB.
# A store that has held this many rows is replaced (a new one costs ~35 ms).
SCRATCH_MAX_ROWS = 200_000


@contextlib.contextmanager
def _worker_store(ctx: WorkContext, big: bool) -> Iterator[Store]:
    """The store a worker checks one file on: this thread's in-memory scratch store, or for a
    big streamed file a store file of its own, for the file's time. Held in memory instead,
    the 5 M-kernel export took 12.8 GB (reader, scratch copy and rules at once); streamed into
    a file, the peak is the streamed read's, the rules' or the rows handed over (there: 1.8,
    1.1, 2.7 GB)."""
    if big:
        with tempfile.TemporaryDirectory(prefix="traceanalyzer-scan-") as tmp:
            with Store(Path(tmp) / "run.duckdb", resources=ctx.resources) as st:
                yield st
        os_memory.give_back()  # the store's memory, before the rows are sent
        return
    st = getattr(_local, "store", None)
    if st is None:
        st = _local.store = Store(":memory:", resources=ctx.resources)
        _local.rows = 0
    elif st.resources != ctx.resources:  # set per scan: an in-process one may follow another
        st.use(ctx.resources)
    yield st


def _scratch_used(rows: int) -> None:
    """Count `rows` as left in this thread's scratch store; past SCRATCH_MAX_ROWS close it, so
    that the next run gets a new one."""
    _local.rows += rows
    if _local.rows >= SCRATCH_MAX_ROWS:
        _local.store.close()
        _local.store = None


def process_file(path: str, ctx: WorkContext) -> FileOutcome:
    """`check_file` on a store of this worker's own, then the run's rows and findings read
    back for the writer. Never raises."""
    big = ctx.stream_min_bytes is not None and big_streamed(path, ctx.stream_min_bytes)
    out = None
    try:
        with _worker_store(ctx, big) as st:
            res = check_file(st, Path(path), ctx.settings, read_stored=True, up_to_date=ctx.up_to_date,
                             hash_name=ctx.hash_name)
            out = FileOutcome(res)
            if res.state in ("stored", "updated"):
                t0 = time.perf_counter()
                try:
                    out.trace = st.read_run(res.run_id, [t for t, n in res.counts.items() if n])
                    out.findings = st.read_findings(res.run_id, res.rule_ids) if res.rule_ids else None
                finally:
                    if not big:
                        st.delete_run(res.run_id)
                        _scratch_used(sum(res.counts.values()))
                res.work_s += time.perf_counter() - t0
    except Exception as e:  # the worker's own store failed (check_file itself never raises)
        interrupt.stop_if_interrupted(e)
        out = FileOutcome(FileResult(path))
        out.result.fail(e)
    return out


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def big_streamed(path: str, min_bytes: int) -> bool:
    """A file of `min_bytes` or more whose reader streams its tables (nsys)."""
    return file_size(path) >= min_bytes and streams(Path(path))
