"""`traceanalyzer runs` and `traceanalyzer summary`: what the store holds, run by run."""

from typing import Annotated, List, Optional

import typer
from rich.table import Column, Table
from rich.text import Text

from .. import fmt
from ..store import StoreError
from .common import StoreOpt, cell, err, open_store, out


def runs(store: StoreOpt = None):
    """List stored runs."""
    with open_store(store, read_only=True) as st:
        df = st.df("""
            SELECT r.run_id, r.format, r.file_name, r.producer_version, r.span_ns,
                   (SELECT count(*) FROM kernels k WHERE k.run_id = r.run_id) AS kernels,
                   (SELECT count(*) FROM copies c WHERE c.run_id = r.run_id) AS copies,
                   (SELECT string_agg(DISTINCT name, ', ') FROM devices d WHERE d.run_id = r.run_id) AS gpus
            FROM runs r ORDER BY r.ingested_at, r.run_id""")
    # The run id and file name are what a user types next: never cut, whatever the width.
    longest = max((len(str(n)) for n in df["file_name"]), default=4)
    t = Table(Column("run", no_wrap=True, min_width=16), "format",
              Column("file", no_wrap=True, min_width=min(longest, 80)), "version", "span", "kernels", "copies", "GPUs")
    for r in df.itertuples():
        t.add_row(r.run_id, r.format, cell(r.file_name), cell(fmt.text(r.producer_version)), fmt.ns(r.span_ns),
                  fmt.num(r.kernels), fmt.num(r.copies), cell(fmt.text(r.gpus)))
    out.print(t)


def summary(run: Annotated[Optional[List[str]], typer.Argument(metavar="RUN...", help="The runs to show (ids, id prefixes or file names) \\[default: every run].")] = None,
            store: StoreOpt = None,
            top: Annotated[int, typer.Option("--top", metavar="N", help="How many kernels to list.")] = 15):
    """Per run: top kernels, copies by direction and memory kind, GPU busy share per device."""
    with open_store(store, read_only=True) as st:
        try:
            ids = [st.resolve_run(r) for r in run] if run else st.run_ids()
        except StoreError as e:
            err.print(f"error: {e}", markup=False)
            raise typer.Exit(2)
        for rid in ids:
            _print_summary(st, rid, top)


def _print_summary(st, rid: str, top: int) -> None:
    from ..report.budget import budget_line, budget_of, busy_split, no_budget_line
    from ..summary import busy, copies, run_info, top_kernels

    info = run_info(st, rid)
    out.rule(Text(f"{rid}  {fmt.printable(info['file_name'])}  ({info['format']})"), style="bold")
    out.print(fmt.printable(f"span {fmt.ns(info['span_ns'])}   producer {fmt.text(info['producer'])} "
                            f"{fmt.text(info['producer_version'], '')}   host {fmt.text(info['host'])}"),
              markup=False)
    budget = budget_of(st, rid)  # first: where each device's time went
    for line in [budget_line(d) for d in budget] or [no_budget_line(info)]:
        out.print(fmt.printable(line), markup=False)
    gpus = busy(st, rid)
    if not gpus.empty:
        split = {d["device_id"]: busy_split(d) for d in budget}
        t = Table("device", "name", "busy", "kernels", "copies", "memsets", "active span", "busy share",
                  "share of run", title="GPU busy")
        for r in gpus.itertuples():
            parts = split.get(r.device_id, {})
            t.add_row(str(r.device_id), cell(fmt.text(r.device)), fmt.ns(r.busy_ns),
                      *(fmt.ns(parts.get(k)) for k in ("kernels", "copies", "memsets")), fmt.ns(r.active_span_ns),
                      fmt.pct(r.busy_share), fmt.pct(r.busy_share_of_run))
        out.print(t)
    k = top_kernels(st, rid, top)
    if k.empty:
        out.print("no kernels in this run")
    else:
        t = Table("kernel", "count", "total", "mean", "median", "min", "max", "share", title="Top kernels by total time")
        for r in k.itertuples():
            t.add_row(cell(_clip(r.kernel)), fmt.num(r.count), fmt.ns(r.total_ns), fmt.ns(r.mean_ns),
                      fmt.ns(r.median_ns), fmt.ns(r.min_ns), fmt.ns(r.max_ns), fmt.pct(r.share))
        out.print(t)
    c = copies(st, rid)
    if not c.empty:
        t = Table("direction", "memory", "count", "bytes", "time", "bandwidth", title="Copies")
        for r in c.itertuples():
            bw = "-" if fmt.text(r.bandwidth_gb_per_s) == "-" else f"{r.bandwidth_gb_per_s:.3g} GB/s"
            t.add_row(r.direction, r.memory_kinds, fmt.num(r.count), fmt.nbytes(r.bytes), fmt.ns(r.total_ns), bw)
        out.print(t)


def _clip(s: str, n: int = 80) -> str:
    s = fmt.text(s, "?")
    return s if len(s) <= n else s[: n - 1] + "…"


def register(app: typer.Typer) -> None:
    app.command()(runs)
    app.command()(summary)
