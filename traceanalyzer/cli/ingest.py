"""`traceanalyzer ingest PATH...`: read trace files into the store."""

from typing import Annotated, List

import typer

from .common import CaptureOpt, DebugOpt, StoreOpt, VerboseOpt, err, file_line, note_not_traces, open_store


def ingest(paths: Annotated[List[str], typer.Argument(metavar="PATH...", help="Trace files, or folders to search (recursively).")],
           store: StoreOpt = None, verbose: VerboseOpt = False, debug: DebugOpt = False, capture: CaptureOpt = None):
    """Read trace files into the store, one transaction per file. A file that cannot be read
    is an error line, and the rest go on. With --capture, the graph replays of the files are merged
    with the capture-phase trace(s) given. Exit 0, or 2 when a file could not be read."""
    from ..batch.check import check_paths

    with open_store(store) as st:
        done = check_paths(st, paths, None, read_stored=True, on_file=lambda r: file_line(r, debug),
                           captures=list(capture or []))
    note_not_traces(done.not_traces, verbose)
    if done.errors:
        err.print(f"{len(done.errors)} input(s) could not be read", markup=False)
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command()(ingest)
