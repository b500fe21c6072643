"""Do two versions of traceanalyzer store the same rows and findings? (`python bench/equivalence.py`)

A refactoring made for speed must not change what is stored. `save DIR` ingests every real
trace (../shared/traces) and every bundled fixture into a fresh store, runs every rule, and
writes each table, sorted on all of its columns, as Parquet under DIR; `check DIR` does the
same with the working tree and reports every table whose rows differ (first differing rows
shown). Times that record *when* (ingested_at, evaluated_at), the source path and the digest of
the code a rule ran (rule_runs.inputs) are left out.

    python bench/equivalence.py save /tmp/before     # on the old code
    python bench/equivalence.py check /tmp/before    # on the new code: exit 1 on a difference
    python bench/equivalence.py check /tmp/before --only nsys   # the traces whose path under
        # ../shared/traces or fixtures/ holds `nsys`, against those runs of the baseline
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from traceanalyzer import schema  # noqa: E402
from traceanalyzer.ingest import TraceError, find_traces  # noqa: E402
from traceanalyzer.rules.engine import run_rules  # noqa: E402
from traceanalyzer.store import Store  # noqa: E402

SOURCES = (ROOT.parent / "shared" / "traces", ROOT / "fixtures")
VOLATILE = {"ingested_at", "evaluated_at", "source_path", "inputs"}  # inputs: a digest of the code


def snapshot(out: Path, only: str | None = None) -> dict[str, pa.Table]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "eq.duckdb")
        for path in find_traces(SOURCES):
            if only and not any(path.is_relative_to(s) and only in str(path.relative_to(s)) for s in SOURCES):
                continue  # matched below its source folder: a checkout's own folder name does not count
            try:
                store.ingest(path)
            except TraceError as e:
                print(f"  {path.name}: {e}")
        run_rules(store)
        tables = {}
        for t in schema.TABLES:
            cols = [c for c in t.column_names if c not in VOLATILE]

            tables[t.name] = store.arrow(f"SELECT {', '.join(cols)} FROM {t.name} ORDER BY ALL")
        store.close()
    return tables


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("save", "check"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--only", help="only traces whose path contains this text")
    a = ap.parse_args()
    tables = snapshot(a.dir, a.only)
    if a.action == "save":
        a.dir.mkdir(parents=True, exist_ok=True)
        for name, tbl in tables.items():
            pq.write_table(tbl, a.dir / f"{name}.parquet")
        print(f"saved {len(tables)} tables to {a.dir}")
        return 0
    bad = 0
    runs = set(tables["runs"]["run_id"].to_pylist())
    for name, tbl in tables.items():
        old = pq.read_table(a.dir / f"{name}.parquet")
        if a.only and "run_id" in old.column_names:  # a baseline of every trace: only the runs read now
            old = old.filter(pc.is_in(old["run_id"], pa.array(sorted(runs), old.schema.field("run_id").type)))
        if old.equals(tbl):
            continue
        bad += 1
        print(f"{name}: {old.num_rows} rows before, {tbl.num_rows} now")
        o, n = old.to_pylist(), tbl.to_pylist()
        shown = 0
        for i, (x, y) in enumerate(zip(o, n)):
            if x != y:
                diff = {k: (x[k], y.get(k)) for k in x if x[k] != y.get(k)}
                print(f"  row {i}: {str(diff)[:400]}")
                shown += 1
                if shown >= 3:
                    break
    print("identical" if not bad else f"{bad} table(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
