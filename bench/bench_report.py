"""How long `traceanalyzer report` takes for a whole store of ~100 runs (target: 100 runs well
under a minute on 2 cores).

Builds a store (or reuses `--store` when it exists): the real traces of ../shared/traces, then
distinct copies of the fixtures (as bench_scan_jobs.py makes them) until it holds `--runs`
runs. Then times, in this one script, each as a user runs it in a fresh process:

* `report --store S -o FILE`: every run of the store (the default without PATH_OR_RUN);
* `report --store S RUN -o FILE`: one run, the baseline: start-up, imports and the page's
  fixed costs.

Prints both, the seconds per run past the first ((all - one) / (runs - 1)) and runs per
second, and saves them to bench/data/report_scale.json; asserts nothing.

    python bench/bench_report.py [--store PATH] [--runs 100] [--repeat 1] [--code DIR] [--ids]

`--code DIR` times the `traceanalyzer` package under DIR (another checkout, or an older
commit's `git archive`) instead of this checkout's; `--ids` names every run on the command
line (what `report` needed before it defaulted to the whole store), to time older code the
same way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from itertools import cycle
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scan_jobs import FIXTURES, ROOT, distinct_copy, sources  # noqa: E402

RESULT = ROOT / "bench" / "data" / "report_scale.json"
SHARED = ROOT.parent / "shared" / "traces"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from traceanalyzer.cli import main; main()", *args]


def run(cmd: list[str], code: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`cmd` with the package under `code` first on the path (run outside any checkout, so
    that no other one is imported from the current folder)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)


def stored_runs(store: Path) -> list[str]:
    if not store.exists():
        return []
    with duckdb.connect(str(store), read_only=True) as con:
        return [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]


def scan(store: Path, folder: Path, work: Path) -> None:
    r = run(cli("scan", "--store", str(store), "--fail-on", "never", str(folder)), ROOT, work)
    if r.returncode not in (0, 2):  # 2: some file could not be read (a few shared traces are no traces)
        raise SystemExit(f"scan of {folder} failed ({r.returncode}): {r.stderr[-2000:]}")


def build(store: Path, runs: int, work: Path) -> None:
    """Scan the shared traces into `store`, then fixture copies until it holds `runs` runs."""
    if SHARED.is_dir() and len(stored_runs(store)) < runs:
        scan(store, SHARED, work)
    have = len(stored_runs(store))
    if have < runs:
        folder = work / "copies"
        folder.mkdir(exist_ok=True)
        # Numbered from the runs stored: copies made for a smaller store before are other bytes.
        for i, src in zip(range(have, runs), cycle(sources())):
            distinct_copy(src, folder / f"run{i:04d}_{src.name}", i)
        scan(store, folder, work)


def time_report(store: Path, out: Path, refs: list[str], code: Path) -> float:
    cmd = cli("report", "--store", str(store), "-o", str(out), *refs)
    t0 = time.perf_counter()
    r = run(cmd, code, out.parent)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"report failed ({r.returncode}): {r.stderr[-2000:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, help="the store to report (built when missing) [default: a temporary one]")
    ap.add_argument("--runs", type=int, default=100, help="runs the store is built up to")
    ap.add_argument("--repeat", type=int, default=1, help="best of this many timings of each command")
    ap.add_argument("--code", type=Path, default=ROOT, help="the folder holding the traceanalyzer package to time "
                                                            "[default: this checkout]")
    ap.add_argument("--ids", action="store_true", help="name every run on the command line")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ta-bench-report-") as tmp:
        work = Path(tmp)
        store = (args.store or work / "store.duckdb").resolve()
        t0 = time.perf_counter()
        build(store, args.runs, work)
        ids = stored_runs(store)
        print(f"store {store}: {len(ids)} runs, {store.stat().st_size / 1e6:.0f} MB "
              f"(built in {time.perf_counter() - t0:.0f} s; sources: {SHARED if SHARED.is_dir() else ''} {FIXTURES})")
        load = os.getloadavg()[0]
        print(f"load average before: {load:.1f} on {os.cpu_count()} CPUs (other work on the machine slows both)")
        out = work / "report.html"
        whole = min(time_report(store, out, ids if args.ids else [], args.code.resolve()) for _ in range(args.repeat))
        size = out.stat().st_size
        one = min(time_report(store, out, ids[:1], args.code.resolve()) for _ in range(args.repeat))
        per_run = (whole - one) / max(len(ids) - 1, 1)
        print(f"report of one run: {one:.2f} s")
        print(f"report of every run: {whole:.2f} s for {len(ids)} runs ({len(ids) / whole:.1f} runs/s, "
              f"{per_run:.3f} s per run past the first; {size / 1e6:.1f} MB of HTML)")
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps({
            "measured": time.strftime("%Y-%m-%d %H:%M"), "runs": len(ids), "load_before": load,
            "whole_s": whole, "one_s": one, "per_run_s": per_run, "html_bytes": size, "ids": args.ids,
            "code": str(args.code.resolve().relative_to(ROOT)) if args.code.resolve().is_relative_to(ROOT) else "other"}, indent=1))
        print(f"saved to {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
