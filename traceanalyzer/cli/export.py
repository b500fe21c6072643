"""`traceanalyzer export --parquet DIR`: the store as a Parquet dataset partitioned by run."""

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from .. import fmt
from ..store import StoreError
from .common import StoreOpt, err, open_store, out


def export(parquet: Annotated[Path, typer.Option("--parquet", metavar="DIR", help="The folder to write the dataset to (created; replaced when it holds an earlier export).")],
           run: Annotated[Optional[List[str]], typer.Option("--run", metavar="RUN", help="Export only these runs (ids, id prefixes or file names; repeat).")] = None,
           store: StoreOpt = None):
    """Write the store as a Parquet dataset: one folder per table, partitioned by run_id
    (Hive layout), readable as it is by DuckDB, Spark, Trino and pyarrow."""
    from ..report.parquet import ExportError, export_parquet

    with open_store(store, read_only=True) as st:
        try:
            ids = [st.resolve_run(r) for r in run] if run else None
            counts = export_parquet(st, parquet, ids)
        except (StoreError, ExportError) as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2)
    runs = counts.get("runs", 0)
    rows = sum(n for name, n in counts.items() if name != "runs")
    out.print(f"wrote {parquet}: {runs} runs, {fmt.num(rows)} rows in "
              f"{sum(1 for n in counts.values() if n)} tables "
              f"(read with read_parquet('{parquet}/TABLE/*/*.parquet', hive_partitioning = true))",
              markup=False)


def register(app: typer.Typer) -> None:
    app.command()(export)
