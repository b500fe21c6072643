"""`traceanalyzer runs` and `traceanalyzer summary`: what the store holds, run by run."""

import json
import sys
from typing import Annotated, List, Optional

import typer

from .common import StoreOpt, check_choices, open_store, out, resolve_runs


def runs(store: StoreOpt = None):
    """List stored runs."""
    from ..report.runs_text import print_runs
    from ..summary import stored_runs

    with open_store(store, read_only=True) as st:
        df = stored_runs(st)
    print_runs(out, df)


SUMMARY_FORMATS = ("text", "json", "csv")
GROUPINGS = ("name", "base")
TEXT_TOP = 15  # kernels a text summary lists unless --top says


def summary(run: Annotated[Optional[List[str]], typer.Argument(metavar="RUN...", help="The runs to show (ids, id prefixes or file names) \\[default: every run].")] = None,
            store: StoreOpt = None,
            top: Annotated[Optional[int], typer.Option("--top", metavar="N", min=1, help=f"How many kernels to list \\[default: {TEXT_TOP} in text, every kernel in json and csv].")] = None,
            by: Annotated[str, typer.Option("--by", metavar="KEY", help="Group kernels by full (demangled) name, or by base name, which pools template variants: name or base.")] = "name",
            format: Annotated[str, typer.Option("--format", metavar="FORMAT", help="text, json or csv.")] = "text"):
    """Per run: time budget, GPU busy per device, kernels (count, total, avg, median, min, max,
    stddev, share: nsys's cuda_gpu_kern_sum), CUDA-graph executions, copies, memsets and device
    memory (reserved, allocated, largest free block, peaks, the peak by category)."""
    from ..report.runs_text import print_summary, summary_of, write_csv

    check_choices(("--format", format, SUMMARY_FORMATS), ("--by", by, GROUPINGS))
    with open_store(store, read_only=True) as st:
        ids = resolve_runs(st, run)
        runs_ = [summary_of(st, rid, by, top or (TEXT_TOP if format == "text" else None)) for rid in ids]
    if format == "json":
        sys.stdout.write(json.dumps(runs_, indent=2) + "\n")
    elif format == "csv":
        write_csv(runs_, sys.stdout)
    else:
        for s in runs_:
            print_summary(out, s)


def register(app: typer.Typer) -> None:
    app.command()(runs)
    app.command()(summary)
