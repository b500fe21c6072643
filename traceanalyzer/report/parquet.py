"""The store as a Parquet dataset, one folder per table, partitioned by run (Hive layout).

    DIR/kernels/run_id=0123456789abcdef/data_0.parquet
    DIR/runs/run_id=.../data_0.parquet
    DIR/_traceanalyzer.json        tables, row counts and column types

DuckDB (`read_parquet('DIR/kernels/*/*.parquet', hive_partitioning = true)`), Spark
(`spark.read.parquet("DIR/kernels")`), Trino/Hive (an external table partitioned by run_id)
and pyarrow.dataset read it as it is. `run_id` lives in the folder names, not in the files,
as Hive partitioning wants. Types are chosen so every engine reads them: JSON columns become
plain strings, timestamps UTC-adjusted ones. A table with no rows gets an empty folder.

The dataset is written beside DIR and then moved into place, so an interrupted export never
leaves a half-written DIR behind; re-exporting into a DIR written by this module replaces it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .. import schema
from ..sql import sql_literal
from ..store import Store

MARKER = "_traceanalyzer.json"


class ExportError(Exception):
    pass


def _select_list(table: schema.Table) -> str:
    cols = []
    for c in table.columns:
        if c.type == "JSON":  # a JSON logical type some engines (Spark) refuse
            cols.append(f"{c.name}::VARCHAR AS {c.name}")
        elif c.type == "TIMESTAMP":  # stored as UTC; say so in the file
            cols.append(f"timezone('UTC', {c.name}) AS {c.name}")
        else:
            cols.append(c.name)
    return ", ".join(cols)


def export_parquet(store: Store, out_dir: str | Path, run_ids: list[str] | None = None) -> dict[str, int]:
    """Write every table of `store` (only `run_ids`, when given) under `out_dir`.
    Returns rows written per table."""
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / MARKER).exists())):
        raise ExportError(f"{out_dir} exists and is not an earlier traceanalyzer export; "
                          "choose a new or empty folder")
    ids = list(run_ids) if run_ids is not None else store.run_ids()
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    counts: dict[str, int] = {}
    try:
        for t in schema.TABLES:
            query = f"SELECT {_select_list(t)} FROM {t.name} WHERE list_contains($ids, run_id)"
            counts[t.name] = store.sql(f"SELECT count(*) FROM {t.name} WHERE list_contains($ids, run_id)",
                                       {"ids": ids}).fetchall()[0][0]
            target = tmp / t.name
            if counts[t.name] == 0:
                target.mkdir()
                continue
            store.sql(f"COPY ({query}) TO {sql_literal(str(target))} "
                      "(FORMAT PARQUET, PARTITION_BY (run_id), COMPRESSION zstd)", {"ids": ids})
        manifest = {
            "format": "traceanalyzer parquet export",
            "partitioning": "hive, by run_id",
            "runs": ids,
            "tables": {t.name: {"rows": counts[t.name],
                                "columns": {c.name: c.type for c in t.columns}} for t in schema.TABLES},
        }
        (tmp / MARKER).write_text(json.dumps(manifest, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return counts
