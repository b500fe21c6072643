"""The table `traceanalyzer scan` prints: one row per run scanned, its time budget and the
largest loss its headlines measure, laid out for the console's width."""

from __future__ import annotations

from rich.console import Console
from rich.table import Column

from .. import fmt
from .terminal import COMPACT, cell, fit_table, left_out, say


def print_scan_table(console: Console, df, report) -> None:
    """The per-run table of a scan (`batch.scan.run_table` with each run's `budget` cell) and the
    line counting what happened to its files (`report`: the scan's `ScanReport`)."""
    num = {"justify": "right", "no_wrap": True}
    columns = [Column("run", no_wrap=True, footer=f"{len(df)} runs"),
               Column("file", overflow="fold", min_width=14), Column("format", no_wrap=True),
               Column("kernels", footer=fmt.num(int(df["kernels"].sum())), **num), Column("span", **num),
               # Of the device with the longest span; on two lines at most ('71% compute ·' and
               # '<1% idle, dependency').
               Column("time budget", min_width=20),
               # the largest share of a device's span the headlines' measured losses take
               Column("loss", **num),
               *(Column(h, footer=fmt.num(int(df[col].sum())), **num)
                 for h, col in (("error", "errors"), ("warn", "warnings"), ("info", "infos")))]

    def layout(split: bool):
        rows = [[r.run_id, cell(r.file_name), r.format, fmt.num(r.kernels), fmt.ns(r.span_ns),
                 r.budget.replace(" · ", " ·\n") if split else r.budget, _loss(r), fmt.num(r.errors),
                 fmt.num(r.warnings), fmt.num(r.infos)] for r in df.itertuples()]
        # The run, its file, budget and findings are what a scan is read for: at 80 columns the
        # format, kernel count and span go (`runs` lists them).
        return fit_table(console, columns, rows, optional=("format", "kernels", "span"),
                         title="Scanned runs", show_footer=True, **COMPACT)

    t, dropped = layout(split=False)
    budget_width = next(c.width for c in t.columns if c.header == "time budget")
    if any(len(b) > budget_width for b in df["budget"]):  # a budget that wraps breaks after its busy part
        t, dropped = layout(split=True)
    console.print(t)
    left_out(console, dropped, "; `traceanalyzer runs` lists them")
    stored, updated, skipped = report.count("stored"), report.count("updated"), report.count("skipped")
    dupes, failed = report.count("duplicate"), len(report.failed)
    say(console, f"{len(report.files)} files in {report.elapsed_s:.1f} s: {stored} stored, {updated} updated, "
                 f"{skipped} skipped (already stored), {dupes} duplicate, {failed} failed")


def _loss(r) -> str:
    """The largest share of a device's span a run's headlines' measured losses take; for a run
    whose losses are all upper bounds (what faster kernels could save) or of causes the trace
    cannot tell, that share as one ("≤96.0%"); without a span (Nsight Compute), their loss."""
    if not r.loss_ns:
        return "-"
    share = r.loss_share if r.loss_share is not None and r.loss_share == r.loss_share else None
    upper = r.upper_share if r.upper_share is not None and r.upper_share == r.upper_share else None
    if share is None and upper is None:
        return fmt.ns(r.loss_ns)
    return fmt.pct(share) if share is not None else f"≤{fmt.pct(upper)}"
