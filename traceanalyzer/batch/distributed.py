"""`scan --scheduler ADDRESS`: the per-file work on a dask cluster, the writing here.

Dask (`dask.distributed`) is an optional dependency: `pip install 'traceanalyzer[dask]'`,
on this machine and on every worker.

Each dask task is `worker.process_file` on one path, the same function the local process
pool runs: `check.check_file` on a store of the worker's own (in memory; a store file for a
big nsys export, which is streamed), then the run's rows read back. Rules are evaluated there, not
centrally after gathering, because they cost more than parsing; the worker hands back the
parsed tables and the findings, and this process (the store's only writer) stores both,
exactly as a local scan does. Cross-run rules then run here on the store. So a cluster scan
and a local scan of the same files give the same store (tests/test_distributed.py checks it).

Workers open the files themselves: every path must be readable by every worker under the
same absolute path (a shared file system), which is how HPC and cloud clusters are run.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

from .worker import FileOutcome, ScanError, WorkContext, process_file

# Files handed to the cluster ahead of the writer, per worker thread: keeps workers busy
# without holding thousands of parsed traces in cluster memory.
IN_FLIGHT_PER_THREAD = 2
CONNECT_TIMEOUT_S = 30


def connect(scheduler: str):
    """A dask Client for a scheduler address (tcp://host:8786) or a scheduler JSON file."""
    try:
        from distributed import Client
    except ImportError:
        raise ScanError("--scheduler needs dask: pip install 'traceanalyzer[dask]'") from None
    try:
        if Path(scheduler).is_file():
            return Client(scheduler_file=scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        return Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise ScanError(f"cannot reach the dask scheduler at {scheduler}: {str(e).splitlines()[0]}") from None


def dask_outcomes(scheduler: str, files: list[str], ctx: WorkContext) -> Iterator[FileOutcome]:
    """Outcomes in completion order from the cluster at `scheduler`."""
    from distributed import as_completed

    client = connect(scheduler)
    try:
        # The context (known hashes, rule settings) goes to every worker once, not per file.
        ctx_future = client.scatter(ctx, broadcast=True, hash=False)
        scan_token = uuid.uuid4().hex[:8]
        pending = iter(enumerate(files))
        paths: dict = {}
        running = as_completed(loop=client.loop)

        def top_up() -> None:
            # Workers may join or leave while the scan runs (adaptive clusters): ask each time.
            limit = IN_FLIGHT_PER_THREAD * max(1, sum(client.nthreads().values()))
            while len(paths) < limit:
                i, path = next(pending, (None, None))
                if path is None:
                    return
                # Keys must be unique: files in different folders share names, scans share clusters.
                fut = client.submit(process_file, path, ctx_future, pure=False,
                                    key=f"traceanalyzer-scan-{scan_token}-{i}-{Path(path).name}")
                paths[fut] = path
                running.add(fut)

        top_up()
        for fut in running:
            path = paths.pop(fut)
            try:
                outcome = fut.result()
            except Exception as e:  # the worker died on it too often (KilledWorker), or was lost
                outcome = FileOutcome.failed(path, f"dask task failed: {type(e).__name__}: "
                                                   f"{str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
            fut.release()
            top_up()
            yield outcome
    finally:
        client.close()
