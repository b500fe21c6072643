"""How fast does an nsys export get from SQLite into Arrow? (`python bench/bench_sqlite_read.py`)

Generates (once, into bench/data/, which git ignores) an export with ~1M kernels and as
many cudaLaunchKernel calls, using the real 3.24.14 CREATE TABLE text, then times:

  baseline       sqlite3 cursor + fetchmany(65536) -> pyarrow record batches
  adbc           ADBC SQLite driver, cursor.fetch_arrow_table()
  *+names(sqlite)   the same, kernel names joined to StringIds inside SQLite
  *+names(duckdb)   integer ids plus all of StringIds, joined in DuckDB (the reader keeps the
                    ids and dictionary-encodes the names instead of joining strings per row)
  read(*)        the whole reader (traceanalyzer.ingest.nsys.read) with that backend

Each is run --repeat times; the best time is reported with its ratio to the baseline
(< 1 is faster). Numbers only, no asserts: the reader uses whichever backend wins here.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "fixtures")]

import duckdb  # noqa: E402
import pyarrow as pa  # noqa: E402

from gen_nsys import TESLA_T4, VM, global_pid, global_tid, schema_statements  # noqa: E402
from traceanalyzer.ingest import nsys  # noqa: E402
from traceanalyzer.ingest.nsys_sources import KERNEL, RUNTIME, SOURCES  # noqa: E402
from traceanalyzer.ingest.nsys_sqlite import Col, NsysFile  # noqa: E402

DATA = ROOT / "bench" / "data"
DISTINCT_KERNELS = 64


def generate(path: Path, n_kernels: int) -> None:
    """An export with n_kernels kernels on 4 streams, each with its launch call; pure SQL inserts."""
    statements = schema_statements("3.24.14")
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    for table in ("StringIds", KERNEL, RUNTIME, "META_DATA_EXPORT", "TARGET_INFO_GPU"):
        con.execute(statements[table])
    con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.24.14')")
    cols = ", ".join(TESLA_T4)
    con.execute(f"INSERT INTO TARGET_INFO_GPU (vmId, id, {cols}) VALUES (?, 0, {', '.join('?' * len(TESLA_T4))})",
                [VM, *TESLA_T4.values()])
    strings = [(1, "cudaLaunchKernel_v7000")]
    for k in range(DISTINCT_KERNELS):  # demangled (2 + 2k) and short (3 + 2k) names
        strings += [(2 + 2 * k, f"void gemm_kernel_{k}<float, 128, 64, true>(float const*, float const*, "
                                f"float*, int, int, int, float, float)"), (3 + 2 * k, f"gemm_kernel_{k}")]
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", strings)
    seq = "WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i < ?)"
    con.execute(f"""{seq} INSERT INTO {RUNTIME} (start, "end", eventClass, globalTid, correlationId, nameId,
                    returnValue) SELECT 1000000000 + i * 2000 - 1500, 1000000000 + i * 2000 - 700, 0, ?, i + 1, 1, 0
                    FROM seq""", [n_kernels - 1, global_tid(4242, 4242)])
    con.execute(f"""{seq} INSERT INTO {KERNEL} (start, "end", deviceId, contextId, streamId, correlationId,
                    globalPid, demangledName, shortName, launchType, cacheConfig, registersPerThread, gridX, gridY,
                    gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread,
                    localMemoryTotal, gridId, sharedMemoryExecuted, sharedMemoryLimitConfig)
                    SELECT 1000000000 + i * 2000, 1000000000 + i * 2000 + 1500, 0, 1, 7 + i % 4, i + 1, ?,
                           2 + 2 * (i % {DISTINCT_KERNELS}), 3 + 2 * (i % {DISTINCT_KERNELS}), 1, 0, 32 + i % 96,
                           160 + i % 1000, 1, 1, 256, 1, 1, i % 4 * 1024, 0, 0, 0, i, 0, 0
                    FROM seq""", [n_kernels - 1, global_pid(4242)])
    con.commit()
    con.close()
    tmp.replace(path)


def kernel_cols() -> list[Col]:
    return [Col(alias, f'"{src}"', typ) for alias, (src, typ) in SOURCES[KERNEL].items()]


def fetch_ints(path: Path, backend: str) -> int:
    with NsysFile(path, backend) as f:
        return f.arrow(kernel_cols(), f'"{KERNEL}"').num_rows


def names_in_sqlite(path: Path, backend: str) -> int:
    cols = kernel_cols() + [Col("name", "dn.value", pa.string()), Col("short_name", "sn.value", pa.string())]
    with NsysFile(path, backend) as f:
        return f.arrow(cols, f'"{KERNEL}" LEFT JOIN StringIds dn ON dn.id = demangledName '
                             "LEFT JOIN StringIds sn ON sn.id = shortName").num_rows


def names_in_duckdb(path: Path, backend: str) -> int:
    with NsysFile(path, backend) as f:
        ints = f.arrow(kernel_cols(), f'"{KERNEL}"')
        strings = f.arrow([Col("id", "id", pa.int64()), Col("value", "value", pa.string())], "StringIds")
    con = duckdb.connect()
    con.register("k", ints)
    con.register("s", strings)
    n = con.sql("SELECT k.*, dn.value AS name, sn.value AS short_name FROM k LEFT JOIN s dn ON dn.id = k.demangled_id "
                "LEFT JOIN s sn ON sn.id = k.short_id").to_arrow_table().num_rows
    con.close()
    return n


def full_read(path: Path, backend: str) -> int:
    return nsys.read(path, backend=backend).tables["kernels"].num_rows


def best_of(fn, repeat: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        rows = fn()
        times.append(time.perf_counter() - t)
    return min(times), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--regen", action="store_true", help="rebuild the generated export")
    args = ap.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"nsys_{args.kernels}_kernels.sqlite"
    if args.regen or not path.exists():
        t = time.perf_counter()
        generate(path, args.kernels)
        print(f"generated {path.name}: {path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s")
    print(f"sqlite {sqlite3.sqlite_version}, duckdb {duckdb.__version__}, pyarrow {pa.__version__}, "
          f"{args.kernels} kernels, best of {args.repeat}")
    cases = [
        ("baseline: sqlite3+fetchmany", lambda: fetch_ints(path, "sqlite3")),
        ("adbc fetch_arrow_table", lambda: fetch_ints(path, "adbc")),
        ("sqlite3 +names(sqlite)", lambda: names_in_sqlite(path, "sqlite3")),
        ("adbc +names(sqlite)", lambda: names_in_sqlite(path, "adbc")),
        ("sqlite3 +names(duckdb)", lambda: names_in_duckdb(path, "sqlite3")),
        ("adbc +names(duckdb)", lambda: names_in_duckdb(path, "adbc")),
        ("read(sqlite3)", lambda: full_read(path, "sqlite3")),
        ("read(adbc)", lambda: full_read(path, "adbc")),
    ]
    base = None
    print(f"{'case':30s} {'seconds':>8s} {'rows/s':>12s} {'ratio':>6s}")
    for label, fn in cases:
        secs, rows = best_of(fn, args.repeat)
        base = base or secs
        print(f"{label:30s} {secs:8.3f} {rows / secs:12,.0f} {secs / base:6.2f}")


if __name__ == "__main__":
    main()
