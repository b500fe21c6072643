"""The nsys runtime table read in one part against one rowid range per fetch thread
(`python bench/bench_nsys_parts.py EXPORT [--rounds N]`).

The reader fetches the table it reads whole, the runtime calls, through `NsysFile.submit` with
`split_rows`: one rowid range per fetch thread, each on its own ADBC connection. This times that
fetch of the reader's own columns with 1 and with 2 fetch threads, alternated `--rounds` times
in one process, and prints wall and CPU seconds of each (the file's pages are in the OS cache
after the first round, as they are for the second half of a real read).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from traceanalyzer.ingest import nsys_sqlite  # noqa: E402
from traceanalyzer.ingest.nsys_sources import RUNTIME, SOURCES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for _ in range(a.rounds):
        for threads in (1, 2):
            nsys_sqlite.fetch_threads = lambda resources, n=threads: n
            with nsys_sqlite.NsysFile(a.export) as f:
                cols = [nsys_sqlite.Col(alias, f.column(RUNTIME, src), typ) for alias, (src, typ) in SOURCES[RUNTIME].items()]
                parts = len(f._parts(f'"{RUNTIME}"', "", 1))
                t, c = time.perf_counter(), time.process_time()
                table = f.submit(cols, f'"{RUNTIME}"', split_rows=1 if threads > 1 else 0).result()
                print(f"{parts} part(s), {table.num_rows:,} calls: {time.perf_counter() - t:.2f} s wall, "
                      f"{time.process_time() - c:.2f} s CPU", flush=True)


if __name__ == "__main__":
    main()
