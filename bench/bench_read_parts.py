"""Does reading a Kineto file in parts pay, through the CLI? (`python bench/bench_read_parts.py`)

Times `traceanalyzer ingest FILE --store NEW` (or `check` with `--check`) in a fresh process
per run, with the file read in parts (`ingest/kineto_parts.py`, one per usable CPU) against
one pass, and for each `--weights` value of `kineto_parts.FIRST_PART_WEIGHT`; the variants
run in rounds (one run of each, then again), so that a neighbour's burst on a shared host
slows one round of all of them. The only change to the command is that one constant, set
before it runs:

    python bench/bench_read_parts.py                       # the 8x dense bench trace, 5 rounds
    python bench/bench_read_parts.py --weights 1.0,1.3,1.6 --rounds 5
    python bench/bench_read_parts.py --file bench/data/kineto_8x/trace.json --check
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_peers import DATA, bench_env, measure_command  # noqa: E402
from gen_big import kineto  # noqa: E402

# The CLI with kineto_parts' constants set first: MIN_PART_BYTES past any file gives one pass.
LAUNCH = ("import sys; from traceanalyzer.ingest import kineto_parts as p; "
          "p.MIN_PART_BYTES = int(sys.argv.pop(1)); p.FIRST_PART_WEIGHT = float(sys.argv.pop(1)); "
          "sys.argv[0] = 'traceanalyzer'; from traceanalyzer.cli import main; main()")
ONE_PASS = str(1 << 62)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=None, help="default: the 8x dense bench trace (made if missing)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--weights", default="1.3", help="FIRST_PART_WEIGHT values to try, comma-separated")
    ap.add_argument("--check", action="store_true", help="time `check` (ingest and every rule), not `ingest`")
    a = ap.parse_args()
    path = (a.file or kineto(8, "dense")).resolve()
    from traceanalyzer.ingest import kineto_parts

    variants = [("one pass", ONE_PASS, "1")] + [
        (f"parts, first part weight {w}", str(kineto_parts.MIN_PART_BYTES), w) for w in a.weights.split(",")]
    command = "check" if a.check else "ingest"
    store = DATA / "stores" / "read_parts.duckdb"
    store.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {v[0]: [] for v in variants}
    print(f"{command} {path} ({path.stat().st_size / 1e6:.0f} MB), {a.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    for i in range(a.rounds):
        for label, min_bytes, weight in variants:
            for p in (store, Path(f"{store}.wal")):
                p.unlink(missing_ok=True)
            r = measure_command([sys.executable, "-c", LAUNCH, min_bytes, weight, command, str(path), "--store",
                                 str(store)], env=bench_env(), label="read_parts")
            runs[label].append(r)
            print(f"  round {i + 1}: {label:<32} " + (f"{r['wall_s']:6.2f} s {r['peak_bytes'] / 1e6:6.0f} MB"
                                                     if "error" not in r else f"ERROR {r['error']}"), flush=True)
    store.unlink(missing_ok=True)
    base = None
    print(f"medians (load {os.getloadavg()[0]:.1f}):")
    for label, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            continue
        t = statistics.median(r["wall_s"] for r in ok)
        m = statistics.median(r["peak_bytes"] for r in ok)
        base = base or t
        print(f"  {label:<32} {t:6.2f} s  {m / 1e6:6.0f} MB  {base / t:5.2f}x the one pass's speed"
              f"  (runs: {', '.join('%.2f' % r['wall_s'] for r in ok)})")


if __name__ == "__main__":
    main()
