"""How much `scan --jobs 2` gains over `--jobs 1` on 200 small runs (target: >= 1.7x).

Makes 200 distinct small traces in a temp folder (the fixtures and a few small real traces,
each copy changed so its content hash differs, else the scan would skip it as already
stored), then times the `traceanalyzer scan` command with --jobs 1 and --jobs 2, each into a
fresh store, in this one script. Prints both times and the ratio (and saves them to
bench/data/scan_jobs.json, which `bench_peers.py` quotes in docs/performance.md); asserts nothing.

    python bench/bench_scan_jobs.py [--runs 200] [--repeat 1]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from itertools import cycle
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
RESULT = ROOT / "bench" / "data" / "scan_jobs.json"  # read by bench_peers.py for docs/performance.md
SHARED = ROOT.parent / "shared" / "traces"
# Small real traces, used when ../shared/traces is there.
REAL = ["torch/hta__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",
        "torch/hta__trace_compare__base__base.json.gz",
        "nsys/cuda-perf-sandbox__report1.sqlite"]


def sources() -> list[Path]:
    found = [p for kind in ("nsys", "kineto", "ncu") for p in sorted((FIXTURES / kind).glob("*"))
             if p.suffix in (".sqlite", ".json", ".gz", ".csv")]  # (fixtures/stores/ holds no traces)
    found += [SHARED / r for r in REAL if (SHARED / r).exists()]
    return found


def distinct_copy(src: Path, dst: Path, i: int) -> None:
    """Copy `src` with a change that alters the bytes but not what the rules see."""
    tag = f"traceanalyzer bench copy {i}"
    if src.suffix == ".sqlite":
        shutil.copyfile(src, dst)
        with sqlite3.connect(dst) as con:  # nsys exports keep strings in StringIds
            con.execute("INSERT INTO StringIds (id, value) VALUES ((SELECT max(id) + 1 FROM StringIds), ?)", [tag])
    elif src.suffix == ".csv":
        dst.write_text(f"==PROF== {tag}\n" + src.read_text())  # ncu log lines are skipped
    else:
        opener = gzip.open if src.suffix == ".gz" else open
        with opener(src, "rt") as f:
            doc = json.load(f)
        doc["traceanalyzerBenchCopy"] = tag  # an extra top-level key
        with (gzip.open if dst.suffix == ".gz" else open)(dst, "wt") as f:
            json.dump(doc, f)


def make_runs(folder: Path, n: int) -> int:
    total = 0
    for i, src in zip(range(n), cycle(sources())):
        dst = folder / f"run{i:04d}_{src.name}"
        distinct_copy(src, dst, i)
        total += dst.stat().st_size
    return total


def time_scan(folder: Path, jobs: int, work: Path) -> float:
    """Wall seconds of one `traceanalyzer scan` into a fresh store."""
    store = work / f"jobs{jobs}.duckdb"
    store.unlink(missing_ok=True)
    cmd = [sys.executable, "-c", "from traceanalyzer.cli import main; main()",
           "scan", "--store", str(store), "--jobs", str(jobs), "--fail-on", "never", str(folder)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"scan --jobs {jobs} failed ({r.returncode}): {r.stderr[-2000:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="best of this many timings per setting")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ta-bench-scan-") as tmp:
        work = Path(tmp)
        folder = work / "runs"
        folder.mkdir()
        nbytes = make_runs(folder, args.runs)
        print(f"{args.runs} runs, {nbytes / 1e6:.1f} MB, from {len(sources())} source traces")
        load = os.getloadavg()[0]
        print(f"load average before: {load:.1f} on {os.cpu_count()} CPUs "
              "(other work on the machine skews the ratio)")
        best = {}
        for jobs in (1, 2):
            best[jobs] = min(time_scan(folder, jobs, work) for _ in range(args.repeat))
            print(f"scan --jobs {jobs}: {best[jobs]:.2f} s ({args.runs / best[jobs]:.1f} runs/s)")
        print(f"speedup --jobs 2 vs --jobs 1: {best[1] / best[2]:.2f}x (target >= 1.7x)")
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps({
            "measured": time.strftime("%Y-%m-%d %H:%M"), "runs": args.runs, "load_before": load,
            "jobs1_s": best[1], "jobs2_s": best[2], "speedup": best[1] / best[2]}, indent=1))
        print(f"saved to {RESULT.relative_to(ROOT)} (docs/performance.md quotes it)")


if __name__ == "__main__":
    main()
