"""A store's schema version, and the numbered steps that bring an older store up to date.

A store records its schema version in `store_info`. Opening a store for writing brings it to
`SCHEMA_VERSION`, each step in its own transaction, so a store made by an earlier release
keeps its runs across an upgrade:

* tables and columns that `schema.py` defines and the store lacks are added (new columns
  are NULL in the runs stored before), so adding a column to the schema needs no step here;
* a numbered step (`MIGRATIONS`) rewrites what a change of meaning needs rewritten.

A store with no `store_info` but a `runs` table was made before versions were recorded:
version 1. A store of a newer version than this release knows is refused, not guessed at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import duckdb
import pyarrow as pa

from .. import kernel_library, schema

SCHEMA_VERSION = schema.SCHEMA_VERSION
INFO_DDL = "CREATE TABLE IF NOT EXISTS store_info (key VARCHAR PRIMARY KEY, value VARCHAR)"


class MigrationError(Exception):
    """A store this release cannot bring up to date."""


@dataclass(frozen=True)
class Migration:
    version: int  # the version the store has once this step ran
    what: str
    run: Callable[[duckdb.DuckDBPyConnection], None]


def _fingerprints_without_file_names(con: duckdb.DuckDBPyConnection) -> None:
    # `rules.engine.fingerprint` in SQL (tests/test_store.py checks the two agree): a store of
    # version 1 fingerprinted findings with their run's file name.
    con.execute("""
        UPDATE findings SET fingerprint = left(sha1(concat_ws(chr(31),
            coalesce(findings.rule_id, ''), coalesce(CAST(r.rank AS VARCHAR), ''),
            coalesce(CAST(findings.device_id AS VARCHAR), ''), coalesce(CAST(findings.stream_id AS VARCHAR), ''),
            coalesce(findings.item_kind, ''), coalesce(findings.item_name, ''))), 16)
        FROM runs r WHERE findings.run_id = r.run_id""")


def _kernel_libraries(con: duckdb.DuckDBPyConnection) -> None:
    # The store tells each kernel's library when it writes the run (store.writer.conform); runs
    # stored before had none. Classified once per distinct name, as a new run is.
    names = con.sql("SELECT DISTINCT name, mangled_name FROM kernels WHERE library IS NULL").to_arrow_table()
    if not names.num_rows:
        return
    libs = names.append_column("library", kernel_library.classify_arrow(names["name"], names["mangled_name"]))
    con.register("_ta_libraries", libs)
    try:
        con.execute("""UPDATE kernels SET library = l.library FROM _ta_libraries l
                       WHERE kernels.library IS NULL AND kernels.name IS NOT DISTINCT FROM l.name
                         AND kernels.mangled_name IS NOT DISTINCT FROM l.mangled_name""")
    finally:
        con.unregister("_ta_libraries")


def _hip_memory_events(con: duckdb.DuckDBPyConnection) -> None:
    # A Kineto trace of PyTorch's ROCm build writes its GPUs' allocator events as HIP (c10
    # device type 6), which the reader kept as the raw code: the memory rules passed them by.
    con.execute("UPDATE memory_events SET device_type = 'cuda' WHERE device_type = '6'")


# The rules whose own evidence has a `warmup_ns` (idle time inside warm-up windows) or a
# `steps` (steps counted): stores of version 4 held the diagnosis's figure there instead.
_OWN_WARMUP_NS, _OWN_STEPS = ("T001", "T003", "T004"), ("T006", "T008")


def _diagnosis_evidence_keys(con: duckdb.DuckDBPyConnection) -> None:
    # The diagnosis wrote a headline's warm-up and per-step figures as `warmup_ns` and `steps`,
    # keys some rules use for figures of their own; it writes them as `loss_warmup_ns` and
    # `loss_steps` now. It wrote `warmup_ns` where it noted warm-up in the message, and `steps`
    # beside `loss_per_step_ns`.
    rows = con.execute("""SELECT rowid, rule_id, message, evidence FROM findings
                          WHERE evidence LIKE '%"loss_per_step_ns"%'
                             OR (evidence LIKE '%"warmup_ns"%' AND message LIKE '%more in warm-up, not counted)%')""").fetchall()
    changed = []
    for rowid, rule_id, message, evidence in rows:
        data = json.loads(evidence)
        if not isinstance(data, dict):
            continue
        if "warmup_ns" in data and "more in warm-up, not counted)" in (message or ""):
            data["loss_warmup_ns"] = data["warmup_ns"] if rule_id in _OWN_WARMUP_NS else data.pop("warmup_ns")
        if "loss_per_step_ns" in data and "steps" in data:
            data["loss_steps"] = data["steps"] if rule_id in _OWN_STEPS else data.pop("steps")
        changed.append((rowid, json.dumps(data)))
    if not changed:
        return
    con.register("_ta_evidence", pa.table({"row": [r for r, _ in changed], "evidence": [e for _, e in changed]}))
    try:
        con.execute("UPDATE findings SET evidence = e.evidence FROM _ta_evidence e WHERE findings.rowid = e.row")
    finally:
        con.unregister("_ta_evidence")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(2, "finding fingerprints name what a finding is about, not the file", _fingerprints_without_file_names),
    Migration(3, "kernels name the library they come from", _kernel_libraries),
    Migration(4, "allocator events of ROCm (HIP) devices are GPU memory", _hip_memory_events),
    Migration(5, "the diagnosis's evidence keys name the loss (loss_warmup_ns, loss_steps)", _diagnosis_evidence_keys),
)


def version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The store's schema version; None for an empty database (no store yet)."""
    tables = {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
        "AND table_schema = 'main'").fetchall()}
    if "store_info" in tables:
        row = con.execute("SELECT value FROM store_info WHERE key = 'schema_version'").fetchone()
        if row is not None:
            return int(row[0])
    return 1 if "runs" in tables else None


def outdated(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store needs `upgrade`; raises MigrationError for a newer store."""
    v = version(con)
    _refuse_newer(v)
    return v is not None and (v < SCHEMA_VERSION or _missing_columns(con))


def upgrade(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Create the store, or bring it to SCHEMA_VERSION; what was done, one line a step."""
    v = version(con)
    _refuse_newer(v)
    done = []
    _in_transaction(con, lambda: _conform(con, done))
    for m in MIGRATIONS:
        if v is not None and v < m.version:
            def step(m=m):
                m.run(con)
                _set_version(con, m.version)
            _in_transaction(con, step)
            done.append(f"schema {m.version}: {m.what}")
    if v is None or v < SCHEMA_VERSION:
        _in_transaction(con, lambda: _set_version(con, SCHEMA_VERSION))
    return done


def _refuse_newer(v: int | None) -> None:
    if v is not None and v > SCHEMA_VERSION:
        raise MigrationError(f"the store has schema version {v}, made by a newer traceanalyzer than this one "
                             f"(which knows up to {SCHEMA_VERSION}): upgrade traceanalyzer to use it")


def _conform(con: duckdb.DuckDBPyConnection, done: list[str]) -> None:
    """Add the tables and columns the schema defines that the store lacks."""
    con.execute(INFO_DDL)
    have = _columns(con)
    for t in schema.TABLES:
        if t.name not in have:
            con.execute(schema.ddl(t))
            continue
        for c in t.columns:
            if c.name not in have[t.name]:
                con.execute(f'ALTER TABLE {t.name} ADD COLUMN "{c.name}" {c.type}')
                done.append(f"added column {t.name}.{c.name}")


def _missing_columns(con: duckdb.DuckDBPyConnection) -> bool:
    have = _columns(con)
    return any(t.name not in have or any(c.name not in have[t.name] for c in t.columns) for t in schema.TABLES)


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM information_schema.columns WHERE "
                                     "table_catalog = current_database() AND table_schema = 'main'").fetchall():
        out.setdefault(table, set()).add(column)
    return out


def _set_version(con: duckdb.DuckDBPyConnection, v: int) -> None:
    con.execute(INFO_DDL)
    con.execute("INSERT OR REPLACE INTO store_info VALUES ('schema_version', ?)", [str(v)])


def _in_transaction(con: duckdb.DuckDBPyConnection, work: Callable[[], None]) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        work()
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
