"""The CPUs one piece of work may use: decided once by its caller, then passed down.

`check` and `report` give one file every usable CPU; `scan` splits its `--jobs` cores between
its workers (`scan.JobPlan`) and gives each worker's store its share. Everything below reads
the value it was handed: the reader (nsys fetch threads, Kineto's split read), the store's
DuckDB threads, and the rules engine's threads. Nothing reads a setting back from DuckDB or
from a context variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# TRACEANALYZER_READ_PROCESSES=1 keeps a Kineto read to one process (no split read) where
# starting a helper process is not wanted; any other value allows the split.
READ_PROCESSES_ENV = "TRACEANALYZER_READ_PROCESSES"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: a batch job's cpuset, not the machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Resources:
    """`cpus` cores for one file's work at a time, and whether its read may start a second
    process (Kineto's split read). The derived values are the one place each is decided."""

    cpus: int
    read_processes: int = 2

    def __post_init__(self) -> None:
        if self.cpus < 1 or self.read_processes < 1:
            raise ValueError(f"resources need at least one CPU and one read process, not {self}")

    @classmethod
    def available(cls, cpus: int | None = None) -> Resources:
        """`cpus` (default: every usable CPU), read processes from TRACEANALYZER_READ_PROCESSES."""
        try:
            processes = max(1, int(os.environ.get(READ_PROCESSES_ENV, "2")))
        except ValueError:
            processes = 1
        return cls(max(1, cpus or usable_cpus()), processes)

    @property
    def duckdb_threads(self) -> int:
        """DuckDB threads of the store this work runs on."""
        return self.cpus

    @property
    def read_cpus(self) -> int:
        """CPUs a reader may use for one file (nsys fetch threads; two for a split Kineto read)."""
        return self.cpus

    @property
    def split_read(self) -> bool:
        """Whether a Kineto read may run in two processes."""
        return self.cpus >= 2 and self.read_processes >= 2

    @property
    def rule_threads(self) -> int:
        """Threads one run's rules are spread over: two where there are two cores. A rules pass
        on a small run is mostly fixed costs (planning twenty queries, pandas), during which
        one core idles; on a second thread one rule's DuckDB work (which lets go of the GIL)
        overlaps another's Python."""
        return 2 if self.cpus >= 2 else 1
