"""Big benchmark inputs grown from real traces (written under bench/data/, which git ignores).

    python bench/gen_big.py kineto --copies 8        # ~445 MB: 8 copies of a 56 MB H100 trace
    python bench/gen_big.py kineto --input dense     # ~380 MB: 8 copies of a trace dense in kernels
    python bench/gen_big.py kineto --input trace_diff  # 8 copies of a second one
    python bench/gen_big.py nsys --kernels 5000000   # ~5 M kernels from a real 3.25.0 export

Kineto: the source trace's events are repeated `copies` times. Two sources (`--input`):
`owlv2`, a 56 MB H100 inference trace that is mostly `python_function` stacks (4.3 k kernels),
and `dense`, HTA's `df_index_resolver` V100 training trace (19.4 k kernels, 42 k runtime calls,
57 k operators: at 8 copies 155 k kernels and 339 k runtime calls), the kind of trace every
event of which the reader keeps. Copy k is shifted by k
periods (the source's span plus 1 ms) and every id that links events (`External id`,
`correlation`, flow `id`, python/record-function ids, `Ev Idx`) by k times that id's
range, so the copies read as consecutive iterations of one job rather than as duplicates.
Metadata events (`ph: "M"`) appear once. The file goes into a folder of its own because
HTA loads every trace in a folder.

nsys: the source export's CREATE TABLE text and all of its rows are copied; the activity
tables that grow with the workload (kernels, runtime API calls, copies, memsets, syncs,
NVTX ranges, unless `--flat-nvtx`: a real PyTorch export carries several per kernel) are then
repeated in SQL (INSERT ... SELECT over a recursive CTE of copy numbers, copy-major
like a real export's time order) with `start`/`end` shifted by k periods and
`correlationId` by k times the source's id range. Everything else (OS runtime,
strings, devices) stays as in the source, and a source without TARGET_INFO_GPU gets the
description of another real export's H100 for each of its devices (`NSYS_GPU_SOURCE`); ANALYSIS_DETAILS gets the new duration. The
kernel count is the smallest whole number of copies reaching `--kernels`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sqlite3
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
TRACES = ROOT.parent / "shared" / "traces"
# Each source and how its events are written: `2`, indented 2 spaces a level as PyTorch's
# exporter writes them (whitespace is a third of such a trace's bytes, and decoders pay for
# it); `0`, one event a line with a space after each `,` and `:`, as Kineto's own writer
# lays them out (the 8x dense file is then 377 MB, the size issue #26 measured).
KINETO_SOURCES = {
    "owlv2": (TRACES / "torch" / "TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz", 2),
    "dense": (TRACES / "torch" / "hta__df_index_resolver__df_index_resolver.json.gz", 0),
    # a second trace dense in kernels, so that a target met on one is seen on another: HTA's
    # trace_diff test trace (V100, 9.9 k kernels, 21 k runtime calls, 31 k operators)
    "trace_diff": (TRACES / "torch" / "hta__trace_diff__test__test.json.gz", 0),
}
NSYS_SOURCE = TRACES / "nsys" / "nsys-ai__tests__fixtures__h100_2gpu_1s.sqlite"
# The source was cut from a real export by a script that dropped TARGET_INFO_GPU; an export
# straight from nsys describes its GPUs, and with their limits the bottleneck rules (waves,
# occupancy) find kernels to name and so compute their launch sites. The description comes from
# another real export of the same GPU model (H100 80GB HBM3), one row per device the kernels name.
NSYS_GPU_SOURCE = TRACES / "nsys" / "Fuser__df8f397__report2.sqlite"

# Kineto ids shifted per copy: top-level keys and keys inside `args`.
KINETO_TOP_IDS = ("id",)
KINETO_ARG_IDS = ("External id", "correlation", "Ev Idx", "Python id", "Python parent id",
                  "Record function id")
KINETO_GAP_US = 1000.0

NSYS_SCALED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                      "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS")
NSYS_GAP_NS = 1_000_000


# -- Kineto ------------------------------------------------------------------------------
def kineto_path(copies: int, input: str = "owlv2") -> Path:
    folder = f"kineto_{copies}x" if input == "owlv2" else f"kineto_{input}_{copies}x"
    return DATA / folder / "trace.json"


def kineto(copies: int, input: str = "owlv2", force: bool = False) -> Path:
    """Write (once) the events of source `input` repeated `copies` times; return the file."""
    import msgspec

    source, indent = KINETO_SOURCES[input]
    out = kineto_path(copies, input)
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = source.read_bytes()
    top = msgspec.json.decode(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = top.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    times = [(e["ts"], e["ts"] + (e.get("dur") or 0)) for e in body if isinstance(e.get("ts"), (int, float))]
    period_us = max(t[1] for t in times) - min(t[0] for t in times) + KINETO_GAP_US
    id_step = {k: _id_range(e.get(k) for e in body) for k in KINETO_TOP_IDS}
    arg_step = {k: _id_range((e.get("args") or {}).get(k) for e in body) for k in KINETO_ARG_IDS}
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(b"{")
        for key, value in top.items():
            f.write(json.dumps(key).encode() + b": " + msgspec.json.encode(value) + b",\n")
        f.write(b'"traceEvents": [\n')
        f.write(_laid_out(meta, indent))
        for k in range(copies):
            shifted = body if k == 0 else [_shift_event(e, k, period_us, id_step, arg_step) for e in body]
            f.write(b",\n" + _laid_out(shifted, indent))
        f.write(b"\n]}")
    tmp.replace(out)
    return out


def _laid_out(events: list, indent: int) -> bytes:
    """The events without their list brackets, laid out as `KINETO_SOURCES` says."""
    import msgspec

    if indent:
        return msgspec.json.format(msgspec.json.encode(events), indent=indent)[1:-1].strip(b"\n")
    return b",\n".join(msgspec.json.format(msgspec.json.encode(e), indent=0) for e in events)


def _id_range(values) -> int:
    ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return (max(ints) - min(ints) + 1) if ints else 0


def _shift_event(e: dict, k: int, period_us: float, id_step: dict, arg_step: dict) -> dict:
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = round(e["ts"] + k * period_us, 3)  # keep Kineto's 3 decimals (ns)
    for key, step in id_step.items():
        if isinstance(e.get(key), int):
            e[key] += k * step
    args = e.get("args")
    if isinstance(args, dict):
        args = e["args"] = dict(args)
        for key, step in arg_step.items():
            v = args.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:  # -1 = "none"
                args[key] = v + k * step
    return e


# -- nsys --------------------------------------------------------------------------------
def nsys_path(kernels: int, flat_nvtx: bool = False) -> Path:
    return DATA / f"nsys_{kernels}_kernels_{'flat' if flat_nvtx else 'nvtx'}_gpus.sqlite"


def nsys(kernels: int, source: Path = NSYS_SOURCE, force: bool = False, flat_nvtx: bool = False) -> Path:
    """Write (once) an export with at least `kernels` kernels grown from `source` (NVTX kept as in
    the source with `flat_nvtx`); return it."""
    out = nsys_path(kernels, flat_nvtx)
    if out.exists() and not force:
        return out
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    # uri=True lets ATTACH open the (read-only, shared) source with mode=ro.
    con = sqlite3.connect(f"file:{tmp}", uri=True, isolation_level=None)
    con.execute("PRAGMA journal_mode = OFF")  # a half-written file is discarded anyway
    con.execute("PRAGMA synchronous = OFF")
    con.execute("ATTACH DATABASE ? AS src", [f"file:{source}?mode=ro"])
    tables = con.execute("SELECT name, sql FROM src.sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
                         "AND name NOT LIKE 'sqlite_%' ORDER BY rowid").fetchall()
    con.execute("BEGIN")
    for _, sql in tables:
        con.execute(sql)
    present = {name for name, _ in tables}
    scaled = [t for t in NSYS_SCALED_TABLES if t in present and not (flat_nvtx and t == "NVTX_EVENTS")]
    n_source = con.execute(f"SELECT count(*) FROM src.{scaled[0]}").fetchone()[0]
    copies = max(1, math.ceil(kernels / max(1, n_source)))
    bounds = [con.execute(f'SELECT min(start), max("end") FROM src.{t}').fetchone() for t in scaled]
    lo, hi = min(b[0] for b in bounds if b[0] is not None), max(b[1] for b in bounds if b[1] is not None)
    correlated = [t for t in scaled if "correlationId" in {r[1] for r in con.execute(f'PRAGMA src.table_info("{t}")')}]
    ids = [con.execute(f"SELECT min(correlationId), max(correlationId) FROM src.{t}").fetchone() for t in correlated]
    clo = min(b[0] for b in ids if b[0] is not None)
    chi = max(b[1] for b in ids if b[1] is not None)
    period_ns = hi - lo + NSYS_GAP_NS
    corr_step = chi - clo + 1
    for name, _ in tables:
        if name not in scaled:
            con.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}"')
            continue
        cols = [r[1] for r in con.execute(f'PRAGMA src.table_info("{name}")')]
        shift = {"start": f"t.start + c.k * {period_ns}", "end": f't."end" + c.k * {period_ns}',
                 "correlationId": f"t.correlationId + c.k * {corr_step}"}
        exprs = ", ".join(shift.get(col, f't."{col}"') for col in cols)
        con.execute(f"""WITH RECURSIVE c(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM c WHERE k < {copies - 1})
                        INSERT INTO main."{name}" ({", ".join(f'"{c}"' for c in cols)})
                        SELECT {exprs} FROM c CROSS JOIN src."{name}" AS t""")
    if "ANALYSIS_DETAILS" in present:
        end = hi + (copies - 1) * period_ns
        con.execute("UPDATE main.ANALYSIS_DETAILS SET stopTime = max(stopTime, ?), duration = max(stopTime, ?) - startTime",
                    [end, end])
    con.execute("COMMIT")
    con.execute("DETACH DATABASE src")
    if "TARGET_INFO_GPU" not in present:
        _describe_gpus(con)
    con.close()
    tmp.replace(out)
    return out


def _describe_gpus(con: sqlite3.Connection) -> None:
    """TARGET_INFO_GPU of NSYS_GPU_SOURCE, one row per device id of the kernels (`id` and
    `cuDevice` set to it), as the export's own description of its GPUs."""
    con.execute("ATTACH DATABASE ? AS gpu", [f"file:{NSYS_GPU_SOURCE}?mode=ro"])
    con.execute("BEGIN")
    sql = con.execute("SELECT sql FROM gpu.sqlite_master WHERE name = 'TARGET_INFO_GPU'").fetchone()[0]
    con.execute(sql)
    cols = [r[1] for r in con.execute('PRAGMA gpu.table_info("TARGET_INFO_GPU")')]
    exprs = ", ".join("d.id" if c in ("id", "cuDevice", "pwGpuId") else f'g."{c}"' for c in cols)
    con.execute(f"""INSERT INTO main.TARGET_INFO_GPU SELECT {exprs}
                    FROM (SELECT DISTINCT deviceId AS id FROM main.CUPTI_ACTIVITY_KIND_KERNEL) d,
                         (SELECT * FROM gpu.TARGET_INFO_GPU ORDER BY id LIMIT 1) g""")
    con.execute("COMMIT")
    con.execute("DETACH DATABASE gpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    k = sub.add_parser("kineto", help="a replicated Kineto JSON trace")
    k.add_argument("--copies", type=int, default=8)
    k.add_argument("--input", choices=sorted(KINETO_SOURCES), default="owlv2", help="the trace repeated")
    n = sub.add_parser("nsys", help="an nsys SQLite export with many kernels")
    n.add_argument("--kernels", type=int, default=5_000_000)
    n.add_argument("--source", type=Path, default=NSYS_SOURCE)
    n.add_argument("--flat-nvtx", action="store_true", help="keep NVTX as in the source instead of growing it")
    for p in (k, n):
        p.add_argument("--force", action="store_true", help="rebuild even if the file exists")
    a = ap.parse_args()
    t = time.perf_counter()
    path = (kineto(a.copies, a.input, a.force) if a.kind == "kineto" else nsys(a.kernels, a.source, a.force, a.flat_nvtx))
    print(f"{path}: {path.stat().st_size / 1e6:.0f} MB ({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
