"""`traceanalyzer ranges`: which code the GPU time came from, per NVTX range, operator or module."""

import sys
from typing import Annotated, List, Optional

import typer

from ..report.ranges_text import write_ranges
from .common import StoreOpt, check_choices, err, open_store, out, resolve_runs

FORMATS = ("text", "json", "csv")
TOP = 20  # text rows by default: a screenful


def ranges(run: Annotated[Optional[List[str]], typer.Argument(metavar="RUN...", help="The runs to show (ids, id prefixes or file names) \\[default: every run].")] = None,
           by: Annotated[str, typer.Option("--by", metavar="KIND", help="Group by NVTX range and user annotation, PyTorch operator, or nn.Module: range, op or module.")] = "range",
           depth: Annotated[Optional[int], typer.Option("--depth", metavar="N", min=1, help="Show N levels of the tree \\[default: all].")] = None,
           sort: Annotated[Optional[str], typer.Option("--sort", metavar="COLUMN", help="With --by op, order the operators by self_cpu, cpu, self_gpu, gpu, calls or name \\[default: self_gpu].")] = None,
           top: Annotated[Optional[int], typer.Option("--top", metavar="N", min=0, help=f"Show the first N rows; 0 shows all \\[default: {TOP} in text, all in json and csv].")] = None,
           format: Annotated[str, typer.Option("--format", metavar="FORMAT", help="text, json or csv.")] = "text",
           store: StoreOpt = None):
    """Per range, operator or module (by its path of names, a tree in text): instances, CPU time,
    kernels launched, GPU time (their durations summed), GPU projection (first GPU operation's
    start to last one's end, nsys's nvtx_gpu_proj_sum), self CUDA memory where the trace has
    allocator events, and the share of the run's kernel time.

    With --by op, text and csv give torch.profiler's key_averages() table instead: per
    operator, self CPU time (its child operators' left out), CPU total, self GPU time (the
    kernels it launched itself), GPU total and calls (json gives both, as `ranges` and
    `operators`)."""
    from ..ranges import BY, OP_SORT, run_ops, run_ranges

    check_choices(("--format", format, FORMATS), ("--by", by, tuple(BY)))
    if sort is not None:
        check_choices(("--sort", sort, tuple(OP_SORT)))
        if by != "op":
            err.print("error: --sort orders the operator table: use it with --by op", markup=False)
            raise typer.Exit(2)
    limit = (TOP if format == "text" else 0) if top is None else top
    with open_store(store, read_only=True) as st:
        ids = resolve_runs(st, run)
        runs_ = [run_ranges(st, rid, by, depth) for rid in ids] if by != "op" or format == "json" else []
        ops = [run_ops(st, rid, sort or "self_gpu") for rid in ids] if by == "op" else []
    write_ranges(out, sys.stdout, runs_, ops, format, limit)


def register(app: typer.Typer) -> None:
    app.command()(ranges)
