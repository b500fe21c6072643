"""`traceanalyzer export-trace`: a run as a Chrome/Perfetto trace with its findings marked."""

from pathlib import Path
from typing import Annotated

import typer

from .common import DebugOpt, StoreOpt, err, open_for_runs


def export_trace(run: Annotated[str, typer.Argument(metavar="RUN", help="A stored run (id, id prefix or file name), or a trace file (ingested and checked when not stored yet).")],
                 output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", help="The JSON trace to write (gzip-compressed when it ends in .gz).")],
                 host: Annotated[bool, typer.Option("--host/--gpu-only", help="Include host API calls, operators, NVTX ranges and launch arrows.")] = True,
                 store: StoreOpt = None, debug: DebugOpt = False):
    """Write a run as a Chrome trace (open it in ui.perfetto.dev or chrome://tracing); each finding is a marker on its track."""
    from ..report.chrome_trace import ExportError, export
    from ..report.model import load_result

    st, done = open_for_runs(store, [run], debug)
    with st:
        run_ids, errors = done.run_ids, done.errors
        if errors or not run_ids:
            raise typer.Exit(2)
        if len(run_ids) > 1:
            err.print(f"error: {run} holds {len(run_ids)} traces; export one run at a time", markup=False)
            raise typer.Exit(2)
        rid = run_ids[0]
        findings = load_result(st, [rid]).findings
        try:
            counts = export(st, rid, findings, output, host=host)
        except (ExportError, OSError) as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2)
    total = sum(counts.values())
    err.print(f"wrote {output}: {total:,} events ({counts.get('kernels', 0):,} kernels, "
              f"{counts.get('copies', 0):,} copies, {len(findings)} finding(s))", markup=False)


def register(app: typer.Typer) -> None:
    app.command("export-trace")(export_trace)
