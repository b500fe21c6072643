"""What every reader returns, and the one error type readers raise."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa


class TraceError(Exception):
    """A file that cannot be read. The message is one line and names the problem;
    the caller adds the file name."""


@dataclass
class ParsedTrace:
    """A reader's output: run facts plus Arrow tables named after `schema.TABLES`.

    Tables hold any subset of a schema table's columns except `run_id` (the store adds
    it and fills missing columns with NULL). Row ids (`kernel_id`, `copy_id`, ...) are
    set by the reader, 0-based and unique within the run.
    """

    format: str
    producer: str | None = None
    producer_version: str | None = None
    schema_version: str | None = None
    host: str | None = None
    clock: str = "none"
    rank: int | None = None
    world_size: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes of Arrow data the tables hold (what storing and dropping them frees)."""
        return sum(t.nbytes for t in self.tables.values())


class TableSink(Protocol):
    """Where a reader that can stream puts its big tables as it builds them, instead of
    holding them all until the end (the store writes them at once: see
    `Store.ingest`). Such a reader leaves in `ParsedTrace.tables` only what it did not
    stream."""

    def add(self, name: str, table: pa.Table) -> None:
        """Append rows to table `name`: the whole table, or its next part in row-id order."""

    def discard(self, name: str) -> None:
        """Forget the rows added to `name` so far (the reader starts that table again)."""


class CollectedTables:
    """A TableSink that keeps the parts in memory: a streaming reader's own default."""

    def __init__(self):
        self.parts: dict[str, list[pa.Table]] = {}

    def add(self, name: str, table: pa.Table) -> None:
        self.parts.setdefault(name, []).append(table)

    def discard(self, name: str) -> None:
        self.parts.pop(name, None)

    def tables(self) -> dict[str, pa.Table]:
        return {name: parts[0] if len(parts) == 1 else pa.concat_tables(parts)
                for name, parts in self.parts.items()}


def count(trace: ParsedTrace, table: str) -> int:
    t = trace.tables.get(table)
    return 0 if t is None else t.num_rows


def as_path(p: str | Path) -> Path:
    return p if isinstance(p, Path) else Path(p)
