"""`traceanalyzer ranges`: which code the GPU time came from, per NVTX range, operator or module."""

import csv
import json
import sys
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from .. import fmt
from .common import StoreOpt, check_choices, open_store, out, resolve_runs

FORMATS = ("text", "json", "csv")
CSV_FIELDS = ("run_id", "name", "path", "depth", "instances", "cpu_ns", "kernels", "gpu_ns", "gpu_proj_ns", "share",
              "gpu_ops", "self_cuda_memory_bytes")
PATH_SEPARATOR = " > "  # between the names of a path in csv
NAME_WIDTH = 60  # a text row's name (indent included) is cut to this


def ranges(run: Annotated[Optional[List[str]], typer.Argument(metavar="RUN...", help="The runs to show (ids, id prefixes or file names) \\[default: every run].")] = None,
           by: Annotated[str, typer.Option("--by", metavar="KIND", help="Group by NVTX range and user annotation, PyTorch operator, or nn.Module: range, op or module.")] = "range",
           depth: Annotated[Optional[int], typer.Option("--depth", metavar="N", min=1, help="Show N levels of the tree \\[default: all].")] = None,
           format: Annotated[str, typer.Option("--format", metavar="FORMAT", help="text, json or csv.")] = "text",
           store: StoreOpt = None):
    """Per range, operator or module (by its path of names, a tree in text): instances, CPU time,
    kernels launched, GPU time (their durations summed), GPU projection (first GPU operation's
    start to last one's end, nsys's nvtx_gpu_proj_sum), self CUDA memory where the trace has
    allocator events, and the share of the run's kernel time."""
    from ..ranges import BY, run_ranges

    check_choices(("--format", format, FORMATS), ("--by", by, tuple(BY)))
    with open_store(store, read_only=True) as st:
        ids = resolve_runs(st, run)
        runs_ = [run_ranges(st, rid, by, depth) for rid in ids]
    if format == "json":
        sys.stdout.write(json.dumps(runs_, indent=2) + "\n")
    elif format == "csv":
        w = csv.DictWriter(sys.stdout, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in runs_:
            for row in r["ranges"]:
                w.writerow({**row, "run_id": r["run_id"], "path": PATH_SEPARATOR.join(row["path"])})
    else:
        for r in runs_:
            print_ranges(out, r)


def print_ranges(console: Console, r: dict) -> None:
    """A run's `ranges.run_ranges` as an indented tree of rows."""
    from ..ranges import WHAT

    console.rule(Text(f"{r['run_id']}  {fmt.printable(r['file_name'])}  ({r['format']})"), style="bold")
    what = WHAT[r["by"]]
    if not r["ranges"]:
        console.print(f"no {what} in this run", markup=False)
        return
    memory = any(x["self_cuda_memory_bytes"] is not None for x in r["ranges"])
    headers = ["instances", "CPU time", "kernels", "GPU time", "GPU proj", "share"] + (["self CUDA mem"] if memory else [])
    t = Table(Column(what[:-1], no_wrap=True), *(Column(h, justify="right", no_wrap=True) for h in headers),
              title=f"GPU time by {what[:-1]} ({fmt.num(r['kernels'])} kernels, {fmt.ns(r['kernel_ns'])})")
    for x in r["ranges"]:
        name = "  " * x["depth"] + fmt.printable(x["name"])
        cells = [fmt.num(x["instances"]), fmt.ns(x["cpu_ns"]), fmt.num(x["kernels"]), fmt.ns(x["gpu_ns"]),
                 fmt.ns(x["gpu_proj_ns"]), fmt.pct(x["share"])]
        if memory:
            cells.append(fmt.nbytes(x["self_cuda_memory_bytes"]))
        t.add_row(Text(name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 1] + "…"), *cells)
    console.print(t)
    if r["kernel_ns"]:
        console.print(f"launched outside every {what[:-1]}: {fmt.ns(r['outside_ns'])} of kernel time "
                      f"({fmt.pct(r['outside_ns'] / r['kernel_ns'])})", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(ranges)
