"""What `traceanalyzer ranges` prints: per run, the GPU time by range, operator or module as an
indented tree, or torch.profiler's key_averages() table of operators; or the same rows as
JSON or CSV."""

from __future__ import annotations

import csv
import json
from typing import TextIO

from rich import box
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from .. import fmt
from ..ranges import WHAT
from .terminal import left_out

CSV_FIELDS = ("run_id", "name", "path", "depth", "instances", "cpu_ns", "kernels", "gpu_ns", "gpu_proj_ns", "share",
              "gpu_ops", "self_cuda_memory_bytes")
PATH_SEPARATOR = " > "  # between the names of a path in csv
NAME_WIDTH = 60  # a text row's name (indent included) is cut to this


OP_CSV_FIELDS = ("run_id", "name", "calls", "self_cpu_ns", "cpu_ns", "self_gpu_ns", "gpu_ns", "kernels")
NAME_MIN = 24  # a text table leaves optional columns out before its names get narrower than this
SORT_WORDS = {"self_cpu": "self CPU time", "cpu": "CPU total", "self_gpu": "self GPU time", "gpu": "GPU total",
              "calls": "calls", "name": "name"}


def write_ranges(console: Console, stream: TextIO, runs: list[dict], ops: list[dict], format: str,
                 limit: int) -> None:
    """`ranges.run_ranges` (`runs`) and `ranges.run_ops` (`ops`) of some runs, as `format` says:
    json (both, one object per run) or csv (the operators' where there are some) to `stream`,
    text to `console`; the first `limit` rows of each (0: all), the text tree's cut where it is
    printed (which says how many more there are)."""
    if limit:
        for r in runs:
            r["ranges"] = r["ranges"][:limit] if format != "text" else r["ranges"]
        for o in ops:
            o["more"], o["operators"] = max(0, len(o["operators"]) - limit), o["operators"][:limit]
    if format == "json":
        if ops:
            runs = [{**r, **{k: o[k] for k in ("sort", "self_cpu_ns", "self_gpu_ns", "operators")}}
                    for r, o in zip(runs, ops)]
        stream.write(json.dumps(runs, indent=2) + "\n")
    elif format == "csv" and ops:
        w = csv.DictWriter(stream, OP_CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for o in ops:
            for row in o["operators"]:
                w.writerow({**row, "run_id": o["run_id"]})
    elif format == "csv":
        w = csv.DictWriter(stream, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in runs:
            for row in r["ranges"]:
                w.writerow({**row, "run_id": r["run_id"], "path": PATH_SEPARATOR.join(row["path"])})
    elif ops:
        for o in ops:
            print_ops(console, o)
    else:
        for r in runs:
            print_ranges(console, r, limit)


def _table(console: Console, name: Column, names: list[str], columns: list[tuple], title: str) -> tuple[Table, list]:
    """A table of `names` and number `columns` ((header, cells, optional) each) that fits the
    console: numbers never cut; where the names would get under NAME_MIN characters, the optional
    columns are left out, last first. Returns the table and the headers left out."""
    def width(cols):  # SIMPLE_HEAD without edges: 3 characters between two columns
        return sum(max(len(h), *(len(c) for c in cells)) for h, cells, _ in cols) + 3 * len(cols)

    longest = max((len(n) for n in names), default=0)
    kept, dropped = list(columns), []
    for col in reversed(columns):
        if console.width - width(kept) >= min(NAME_MIN, longest) or not col[2]:
            continue
        kept.remove(col)
        dropped.append(col[0])
    name.width = max(1, min(max(longest, len(str(name.header))), console.width - width(kept)))
    t = Table(name, *(Column(h, justify="right", no_wrap=True) for h, _, _ in kept),
              box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title=title)
    for i, n in enumerate(names):
        t.add_row(Text(n), *(cells[i] for _, cells, _ in kept))
    return t, dropped[::-1]


def print_ranges(console: Console, r: dict, limit: int = 0) -> None:
    """A run's `ranges.run_ranges` as an indented tree of rows, the first `limit` (0: all)."""
    console.rule(Text(f"{r['run_id']}  {fmt.printable(r['file_name'])}  ({r['format']})"), style="bold")
    what = WHAT[r["by"]]
    if not r["ranges"]:
        console.print(f"no {what} in this run", markup=False)
        return
    rows = r["ranges"][:limit or None]
    names = []
    for x in rows:
        name = "  " * x["depth"] + fmt.printable(x["name"])
        names.append(name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 1] + "…")
    columns = [("instances", [fmt.num(x["instances"]) for x in rows], True),
               ("CPU time", [fmt.ns(x["cpu_ns"]) for x in rows], False),
               ("kernels", [fmt.num(x["kernels"]) for x in rows], False),
               ("GPU time", [fmt.ns(x["gpu_ns"]) for x in rows], False),
               ("GPU proj", [fmt.ns(x["gpu_proj_ns"]) for x in rows], True),
               ("share", [fmt.pct(x["share"]) for x in rows], False)]
    if any(x["self_cuda_memory_bytes"] is not None for x in r["ranges"]):
        columns.append(("self CUDA mem", [fmt.nbytes(x["self_cuda_memory_bytes"]) for x in rows], True))
    t, dropped = _table(console, Column(what[:-1], no_wrap=True, overflow="ellipsis"),
                        names, columns,
                        f"GPU time by {what[:-1]} ({fmt.num(r['kernels'])} kernels, {fmt.ns(r['kernel_ns'])})")
    console.print(t)
    left_out(console, dropped, "; --format json has every column")
    more = len(r["ranges"]) - limit if limit else 0
    if more > 0:
        console.print(f"... and {fmt.num(more)} more rows (--top 0 shows all, --depth N fewer levels)", markup=False)
    if r["kernel_ns"]:
        console.print(f"launched outside every {what[:-1]}: {fmt.ns(r['outside_ns'])} of kernel time "
                      f"({fmt.pct(r['outside_ns'] / r['kernel_ns'])})", markup=False)


def print_ops(console: Console, o: dict) -> None:
    """A run's `ranges.run_ops` as torch.profiler's key_averages() table: numbers never cut, the
    operator's name folded onto more lines where the terminal is narrow."""
    console.rule(Text(f"{o['run_id']}  {fmt.printable(o['file_name'])}  ({o['format']})"), style="bold")
    rows = o["operators"]
    if not rows:
        console.print("no operators in this run", markup=False)
        return
    columns = [("self CPU", [fmt.ns(x["self_cpu_ns"]) for x in rows], False),
               ("self CPU %", [fmt.pct(x["self_cpu_share"]) for x in rows], True),
               ("CPU total", [fmt.ns(x["cpu_ns"]) for x in rows], False),
               ("self GPU", [fmt.ns(x["self_gpu_ns"]) for x in rows], False),
               ("self GPU %", [fmt.pct(x["self_gpu_share"]) for x in rows], True),
               ("GPU total", [fmt.ns(x["gpu_ns"]) for x in rows], False),
               ("calls", [fmt.num(x["calls"]) for x in rows], False)]
    t, dropped = _table(console, Column("operator", overflow="fold"),
                        [fmt.printable(x["name"]) for x in rows], columns,
                        f"PyTorch operators by {SORT_WORDS[o['sort']]} (%: of all operators' self time)")
    console.print(t)
    left_out(console, dropped, "; --format json has every column")
    if o.get("more"):
        console.print(f"... and {fmt.num(o['more'])} more operators (--top 0 shows all, --sort COLUMN orders them)",
                      markup=False)
    console.print(f"self CPU time total: {fmt.ns(o['self_cpu_ns'])}; self GPU time total: {fmt.ns(o['self_gpu_ns'])} "
                  f"of {fmt.ns(o['kernel_ns'])} kernel time", markup=False)
