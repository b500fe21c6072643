"""Where a `check` spends its time and memory, phase by phase (`python bench/profile_check.py FILE`).

Runs `traceanalyzer check FILE --store STORE` in this process, as the CLI does, and prints
for each phase its wall seconds, the CPU seconds of all its threads (phases on rule threads
see each other's), the peak resident memory reached within it (Linux: the
process's high-water mark is reset at each phase's start by writing 5 to
/proc/self/clear_refs) and the resident memory at its start. The phases are the functions a check goes through: the read into the
store, the run's shared views (`run_cache.scoped_to_run`), the rules (each rule's wall time,
rules running on two threads overlap), the diagnosis, writing the findings, loading the
result and the report. A phase inside another is printed indented.

    python bench/profile_check.py bench/data/nsys_5000000_kernels_nvtx.sqlite
    python bench/profile_check.py bench/data/kineto_dense_8x/trace.json --store S.duckdb  # S kept: a stored check
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

_depth = threading.local()
_lock = threading.Lock()
rows: list[tuple[float, int, str, float, float, int, int]] = []  # (start, depth, phase, seconds, CPU seconds, peak, held at start)


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


def _rss_peak() -> int:
    return _status_bytes("VmHWM:")


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


_open: list[list[int]] = []  # the peak so far of each phase open now, outermost first


@contextlib.contextmanager
def phase(name: str, peak: bool = True, depth: int | None = None):
    """Time the block; with `peak`, the process's peak memory within it. An inner phase
    resets the high-water mark, first handing the mark so far to the phases open around it:
    an outer one's peak is the larger of what it saw between its inner phases and theirs."""
    outer = getattr(_depth, "n", 0)
    depth = outer if depth is None else depth
    _depth.n = outer + 1
    seen = [0]
    if peak:
        mark = _rss_peak()
        for p in _open:
            p[0] = max(p[0], mark)
        _reset_peak()
        _open.append(seen)
    held = _status_bytes("VmRSS:") if peak else 0
    first = len(rows)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        _depth.n = outer
        if peak:
            _open[:] = [p for p in _open if p is not seen]  # by identity: equal marks are other phases'
        with _lock:
            inner = max((r[5] for r in rows[first:]), default=0)
            top = max(_rss_peak(), seen[0], inner) if peak else 0
            rows.append((t0, depth, name, time.perf_counter() - t0, time.process_time() - c0, top, held))


def wrap(owner, attr: str, name: str | None = None, peak: bool | str = True, label=None, depth: int | None = None) -> None:
    fn = getattr(owner, attr)
    is_cm = attr == "scoped_to_run"

    if is_cm:
        @contextlib.contextmanager
        def wrapped(*a, **k):
            with phase(name or attr, peak, depth):
                cm = fn(*a, **k)
                value = cm.__enter__()
            try:
                yield value
            except BaseException:
                if not cm.__exit__(*sys.exc_info()):
                    raise
            else:
                cm.__exit__(None, None, None)
    else:
        @functools.wraps(fn)
        def wrapped(*a, **k):
            on_main = threading.current_thread() is threading.main_thread()
            with phase(label(*a, **k) if label else (name or attr), peak == "main" and on_main or peak is True, depth):
                return fn(*a, **k)
    setattr(owner, attr, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--store", default=None, help="default: a new store in a temporary folder")
    ap.add_argument("args", nargs="*", help="more arguments for `check` (after --)")
    a = ap.parse_args()

    t_import = time.perf_counter()
    from traceanalyzer import diagnosis
    from traceanalyzer.batch import check as batch_check
    from traceanalyzer.cli import check as cli_check
    from traceanalyzer.cli import main as cli_main
    from traceanalyzer.ingest import nsys
    from traceanalyzer.rules import engine
    from traceanalyzer.store import Store, run_cache
    imports_s = time.perf_counter() - t_import

    wrap(Store, "ingest", "read and store (Store.ingest)")
    stages = []
    for name, stage in nsys.STAGES:  # the nsys reader's stages, in the order it runs them
        holder = SimpleNamespace(stage=stage)
        wrap(holder, "stage", f"nsys {name}", depth=2)
        stages.append((name, holder.stage))
    nsys.STAGES = tuple(stages)
    wrap(run_cache, "scoped_to_run", "the run's shared views (scoped_to_run, entered)")
    # Rules on worker threads (runs under `RunPolicy.parallel_max_gpu_ops`) overlap: their peaks are
    # the rules pass's; a rule on the main thread has its own.
    wrap(engine, "evaluate_rule", peak="main", label=lambda st, rule, *a, **k: f"rule {rule.id}", depth=2)
    wrap(diagnosis, "diagnose", "diagnosis")
    wrap(Store, "write_findings", "write findings")
    wrap(batch_check, "run_rules", "rules passes (run_rules)")
    wrap(batch_check, "store_diagnosed", "diagnose and store (store_diagnosed)")
    wrap(batch_check, "run_check", "run_check")
    wrap(batch_check, "file_hash", "hash the file (file_hash)")
    wrap(batch_check, "link_pairs", "link timeline and ncu runs (link_pairs)")
    wrap(batch_check, "load_result", "load the result (load_result)")
    wrap(cli_check, "emit", "report (emit)")

    with tempfile.TemporaryDirectory() as tmp:
        store = a.store or str(Path(tmp) / "store.duckdb")
        sys.argv = ["traceanalyzer", "check", a.file, "--store", store, *a.args]
        out = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli_main()
        total = time.perf_counter() - t0

    sys.stderr.flush()
    print(f"{a.file}: check {total:.2f} s, peak {max(r[5] for r in rows) / 1e6:,.0f} MB; imports {imports_s:.2f} s")
    print(f"  {'phase':<56} {'wall':>10} {'CPU':>10} {'peak':>12} {'at start':>12}")
    for _, depth, name, s, cpu, peak, held in sorted(rows):
        print(f"  {'  ' * depth}{name:<{56 - 2 * depth}} {s:8.2f} s {cpu:8.2f} s"
              + (f" {peak / 1e6:9,.0f} MB {held / 1e6:9,.0f} MB" if peak else ""))


if __name__ == "__main__":
    main()
