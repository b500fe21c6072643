"""`traceanalyzer diff BASE TEST`: did the optimization pay? Whether the runs are alike, kernels,
end-to-end time (per step, throughput or span), busy time per device, memory (by category where
both runs have categories), findings."""

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from .common import PIPED_WIDTH, StoreOpt, err, open_store, out


def diff(base: Annotated[str, typer.Argument(metavar="BASE", help="The run before: a trace file (ingested and checked if needed), or a stored run id, id prefix or file name.")],
         test: Annotated[str, typer.Argument(metavar="TEST", help="The run after, in the same forms.")],
         store: StoreOpt = None,
         gate: Annotated[Optional[float], typer.Option("--gate", min=0, metavar="PCT", help="Exit 1 when end-to-end time or peak memory grows by more than PCT percent, or when the comparison is inconclusive (runs not alike, no end-to-end time in both).")] = None,
         by: Annotated[str, typer.Option("--by", metavar="name|short", help="Match kernels by full `name` (white space ignored) or `short` base name (template instances pooled).")] = "name",
         step: Annotated[Optional[str], typer.Option("--step", "--step-range", metavar="RANGE", help="The range name that marks one step (an NVTX range or user annotation, as stored or normalised); its median time is the end-to-end time \\[default: the steps both runs have (ProfilerStep#N, else NVTX ranges named like steps: the `steps` view), else throughput for a time-sliced capture, else the span].")] = None,
         noise: Annotated[float, typer.Option("--noise", min=0, metavar="PCT", help="Changes below PCT percent count as unchanged in the verdict.")] = 1.0,
         top: Annotated[int, typer.Option("--top", min=1, metavar="N", help="How many rows each table shows.")] = 15,
         allow_different: Annotated[bool, typer.Option("--allow-different-hardware", help="Gate runs that are not alike (other GPUs, world size, rank or capture window) all the same.")] = False,
         fmt_: Annotated[str, typer.Option("--format", metavar="text|json", help="Output format.")] = "text",
         as_json: Annotated[bool, typer.Option("--json", help="Write the whole comparison as JSON (same as --format json).")] = False,
         output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE", help="Write the comparison to this file; standard output then gets the verdict line (and the gate's).")] = None):
    """Compare two runs: whether they are alike (GPU model and count, SM count, world size,
    rank, capture window), time per kernel (matched by name, with count changes), end-to-end
    time (median step, throughput for time-sliced captures, span), GPU busy time per device
    (devices matched by role: local GPU index), NVTX ranges, peak memory (per device, and per
    category when both runs have categories), new and fixed findings, and a verdict:
    IMPROVED, REGRESSED, MIXED, NO CHANGE, UNKNOWN, or INCONCLUSIVE with the reasons when the
    runs are not alike.

    Exit 0 without --gate, whatever the verdict (diff gates only with --gate); with --gate, 1
    when it is exceeded or the comparison is inconclusive (unless --allow-different-hardware for
    runs not alike); 2 on unreadable input or a usage error."""
    from ..diff import DiffError, diff_runs
    from ..report.diff_text import gate_words, print_diff

    if fmt_ not in ("text", "json"):
        err.print(f"error: --format must be text or json, not {fmt_!r}", markup=False)
        raise typer.Exit(2)
    with open_store(store) as st:
        try:
            base_id, test_id = _prepare(st, [base, test])
            d = diff_runs(st, base_id, test_id, by=by, step=step)
        except DiffError as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2)
    as_json = as_json or fmt_ == "json"
    result = d.gate(gate, allow_different) if gate is not None else None
    gate_line = None if result is None else f"gate {gate:g}%: " + gate_words(result)
    try:
        fh = open(output, "w") if output else None
    except OSError as e:
        err.print(f"error: {output}: cannot write: {e.strerror or e}", markup=False)
        raise typer.Exit(2)
    with fh or contextlib.nullcontext():
        if as_json:
            doc = d.to_dict(noise)
            if result is not None:
                doc["gate"] = result
            (fh or sys.stdout).write(json.dumps(doc, indent=2, default=str) + "\n")
        else:
            console = Console(file=fh, width=PIPED_WIDTH, no_color=True, highlight=False, soft_wrap=True) if fh else out
            print_diff(console, d, top, noise)
            if result is not None:
                for n in result["notes"]:
                    console.print(f"note: {n}", markup=False)
                console.print(gate_line, markup=False)
    if output:  # the log still says how it came out
        out.print(f"verdict: {d.verdict(noise)[1]}", markup=False)
        if gate_line:
            out.print(gate_line, markup=False)
    if result is not None and result["inconclusive"]:
        err.print(f"gate {gate:g}%: inconclusive: {'; '.join(result['inconclusive'])}", markup=False)
    raise typer.Exit(0 if result is None or result["passed"] else 1)


def _prepare(st, refs: list[str]) -> list[str]:
    """Run ids for BASE and TEST (`check.runs_for`: files are checked when new; rules run
    where their findings are missing or were made with other thresholds). Per-run rules
    only: BASE and TEST are not ranks of one job, so cross-run rules do not apply."""
    from ..batch.check import CheckOptions, UsageError, runs_for, settings_from
    from ..diff import DiffError

    try:
        settings, _ = settings_from(CheckOptions(paths=[]))
    except UsageError as e:
        raise DiffError(str(e)) from None
    ids = []
    for ref in refs:
        done = runs_for(st, [ref], settings, same_rules=True)
        if done.errors:
            raise DiffError(f"{ref}: {done.errors[0].message}")
        if len(done.run_ids) != 1:
            raise DiffError(f"{ref}: holds {len(done.run_ids)} traces; compare one run with one run")
        ids += done.run_ids
    return ids


def register(app: typer.Typer) -> None:
    app.command()(diff)
