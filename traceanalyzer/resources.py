"""The CPUs and memory one piece of work may use: decided once by its caller, then passed down.

`check` and `report` give one file every usable CPU; `scan` splits its `--jobs` cores between
its workers (`scan.JobPlan`) and gives each worker's store its share. Everything below reads
the value it was handed: the reader (nsys fetch threads, Kineto's parts), the store's DuckDB
threads, and the rules engine's threads. Nothing reads a setting back from DuckDB or from a
context variable.

Memory: every DuckDB connection traceanalyzer opens, the store's and a reader's own, goes
through `connect_duckdb`, which gives it TRACEANALYZER_MEMORY_LIMIT (`limit_memory`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .interrupt import interruptible

if TYPE_CHECKING:
    import duckdb

# DuckDB's syntax: `2GB`, `512MiB`, `40%`. Unset: DuckDB's own default (80% of RAM), but for
# the rules pass of a big run (`store.run_policy.RunPolicy.big_run_memory`).
MEMORY_LIMIT_ENV = "TRACEANALYZER_MEMORY_LIMIT"


class MemoryLimitError(ValueError):
    """TRACEANALYZER_MEMORY_LIMIT holds something DuckDB does not take as a memory size."""


def memory_limit_text() -> str:
    """TRACEANALYZER_MEMORY_LIMIT as set ('' when unset)."""
    return os.environ.get(MEMORY_LIMIT_ENV, "").strip()


def limit_memory(con: duckdb.DuckDBPyConnection) -> None:
    """Cap what DuckDB holds on `con`'s database (sorts, joins, cached blocks) at
    TRACEANALYZER_MEMORY_LIMIT; past it, work spills to DuckDB's temp folder instead of growing.
    Unset: DuckDB's default again (after a `SET memory_limit` of the caller's)."""
    import duckdb

    text = memory_limit_text()
    try:
        con.execute(f"SET memory_limit = '{text.replace(chr(39), '')}'" if text else "RESET memory_limit")
    except duckdb.Error as e:
        raise MemoryLimitError(f"{MEMORY_LIMIT_ENV}={text!r} is not a memory size DuckDB accepts "
                               f"({str(e).splitlines()[0]})") from None


def connect_duckdb(database: str = ":memory:", *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with `limit_memory` applied, that Ctrl-C interrupts (see
    `interrupt`): the one way traceanalyzer connects."""
    import duckdb

    con = interruptible(duckdb.connect(database, read_only=read_only))
    try:
        limit_memory(con)
    except BaseException:
        con.close()
        raise
    return con


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a batch job's cpuset, not the machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Resources:
    """`cpus` cores for one file's work at a time. The derived values are the one place each
    is decided."""

    cpus: int

    def __post_init__(self) -> None:
        if self.cpus < 1:
            raise ValueError(f"resources need at least one CPU, not {self}")

    @classmethod
    def available(cls, cpus: int | None = None) -> Resources:
        """`cpus` (default: every usable CPU)."""
        return cls(max(1, cpus or usable_cpus()))

    @property
    def duckdb_threads(self) -> int:
        """DuckDB threads of the store this work runs on."""
        return self.cpus

    @property
    def read_cpus(self) -> int:
        """CPUs a reader may use for one file (nsys fetch threads; Kineto parts, a process each)."""
        return self.cpus

    @property
    def rule_threads(self) -> int:
        """Threads one run's rules are spread over: two where there are two cores, where one
        rule's DuckDB work (which lets go of the GIL) overlaps another's Python. The rules
        engine keeps a small run's rules on one thread (`RunPolicy.parallel_min_gpu_ops`)."""
        return 2 if self.cpus >= 2 else 1
