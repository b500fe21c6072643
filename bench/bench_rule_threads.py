"""A run's rules pass on one thread against two (`engine.rule_threads`), for choosing
`RunPolicy.parallel_min_gpu_ops`: each file is checked into a scratch store once, then its rules
pass runs again and again (stored outcomes not reused), one and two threads in turn; the
fastest of the tries of each is printed, wall and CPU seconds of this process.

    python bench/bench_rule_threads.py fixtures/kineto/timeline_warmup.json ../shared/traces/torch/*.json.gz
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from traceanalyzer.batch.check import check_file
from traceanalyzer.rules import engine
from traceanalyzer.rules.engine import Settings, run_rules
from traceanalyzer.store import Store, run_cache
from traceanalyzer.store.run_policy import RunPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--tries", type=int, default=3)
    args = ap.parse_args()
    any_size = Settings(reuse=False, policy=RunPolicy(parallel_min_gpu_ops=0))  # the thread count alone decides
    print(f"{'gpu ops':>9}  {'1 thread wall/cpu s':>20}  {'2 threads wall/cpu s':>20}  file")
    for path in args.files:
        with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "s.duckdb") as st:
            check_file(st, path, Settings())
            run_id = st.run_ids()[0]
            best: dict[int, tuple[float, float]] = {}
            for _ in range(args.tries):
                for n in (1, 2):
                    engine.rule_threads = lambda _st, n=n: n
                    wall, cpu = time.perf_counter(), time.process_time()
                    run_rules(st, [run_id], any_size)
                    took = (time.perf_counter() - wall, time.process_time() - cpu)
                    best[n] = min(best.get(n, took), took)
            ops = run_cache.gpu_ops(st.con, run_id)
            print(f"{ops:>9,}  {best[1][0]:>9.2f} / {best[1][1]:<8.2f}  {best[2][0]:>9.2f} / {best[2][1]:<8.2f}  {path.name}")


if __name__ == "__main__":
    main()
