"""`traceanalyzer runs` and `traceanalyzer summary` as text (and the summary as CSV): the
store's runs as a table, and a run's summary (`summary_of`: `summary.run_summary` with the
run's time budget) as lines and tables laid out for the console's width."""

from __future__ import annotations

import csv
from typing import Optional

from rich import box
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from .. import fmt
from ..summary import RUN_FIELDS, run_summary
from .budget import (
    budget_line,
    budget_lines,
    budget_of,
    busy_split,
    no_budget_line,
    without_kernels_line,
)
from .terminal import cell, fit_table, left_out, say

MIN_NAME_WIDTH = 36  # a narrower kernel column: the names go under the table, a line each
CSV_FIELDS = ("run_id", "kind", "name", "count", "total_ns", "avg_ns", "median_ns", "min_ns", "max_ns",
              "stddev_ns", "share")


def print_runs(console: Console, df) -> None:
    """The store's runs (`summary.stored_runs`) as a table."""
    # The run id and file name are what a user types next: the id never cut, the file name
    # folded onto more lines at worst; at 80 columns the version, GPUs, copies and format go first.
    num = {"justify": "right", "no_wrap": True}
    columns = [Column("run", no_wrap=True), Column("format", no_wrap=True),
               Column("file", overflow="fold", min_width=40), Column("version"),
               Column("span", **num), Column("kernels", **num), Column("copies", **num), Column("GPUs")]
    rows = [[r.run_id, r.format, cell(r.file_name), cell(fmt.text(r.producer_version)), fmt.ns(r.span_ns),
             fmt.num(r.kernels), fmt.num(r.copies), cell(fmt.text(r.gpus))] for r in df.itertuples()]
    t, dropped = fit_table(console, columns, rows, optional=("version", "GPUs", "copies", "format"))
    console.print(t)
    left_out(console, dropped)


def summary_of(st, rid: str, by: str, top: Optional[int]) -> dict:
    """`summary.run_summary` with the run's time budget, and each device's busy time split
    into the budget's exclusive parts (kernels_ns, copies_ns, memsets_ns)."""
    s = run_summary(st, rid, by, top)
    budget = budget_of(st, rid)
    split = {d["device_id"]: busy_split(d) for d in budget}
    for g in s["busy"]:
        parts = split.get(g["device_id"], {})
        g.update({f"{k}_ns": parts.get(k) for k in ("kernels", "copies", "memsets")})
    info = {k: s.pop(k) for k in RUN_FIELDS}
    return {**info, "budget": budget, **s}


def write_csv(runs_: list[dict], stream) -> None:
    """One row per kernel and per CUDA graph (kind `kernel` or `cuda_graph`) of every run."""
    w = csv.DictWriter(stream, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for s in runs_:
        for kind, rows in (("kernel", s["kernels"]), ("cuda_graph", s["graphs"])):
            for r in rows:
                w.writerow({**r, "run_id": s["run_id"], "kind": kind})


def print_summary(console: Console, s: dict) -> None:
    """A run's summary (`summary_of`) as text, laid out for the console's width."""
    console.rule(Text(f"{s['run_id']}  {fmt.printable(s['file_name'])}  ({s['format']})"), style="bold")
    say(console, fmt.printable(f"span: {fmt.ns(s['span_ns'])}   producer: {fmt.text(s['producer'])} "
                               f"{fmt.text(s['producer_version'], '')}   host: {fmt.text(s['host'])}"))
    for line in [line for d in s["budget"] for line in budget_lines(d)] or [no_budget_line(s)]:
        say(console, fmt.printable(line))
    if without_kernels_line(s.get("without_kernels")):
        say(console, fmt.printable(without_kernels_line(s["without_kernels"])))
    st = s.get("steps")
    if st:
        outliers = ", ".join(f"#{o['index']} {fmt.ns(o['ns'])}" for o in st["outliers"][:5])
        say(console, fmt.printable(
            f"steps {st['steps']} ({st['step']}): median {fmt.ns(st['median_ns'])}, p90 {fmt.ns(st['p90_ns'])}"
            + (f", {st['warmup_steps']} warm-up set apart" if st["warmup_steps"] else "")
            + (f", outliers {outliers}" if outliers else "")))
    num = {"justify": "right", "no_wrap": True}
    if s["busy"]:
        columns = [Column("device", no_wrap=True), Column("name"), Column("busy", **num),
                   *(Column(h, **num) for h in ("kernels", "copies", "memsets", "active span", "busy share",
                                                 "share of run"))]
        rows = [[str(r["device_id"]), cell(fmt.text(r["device"])), fmt.ns(r["busy_ns"]),
                 *(fmt.ns(r[f"{k}_ns"]) for k in ("kernels", "copies", "memsets")),
                 fmt.ns(r["active_span_ns"]), fmt.pct(r["busy_share"]), fmt.pct(r["busy_share_of_run"])]
                for r in s["busy"]]
        _print_fit(console, columns, rows, ("memsets", "share of run"), title="GPU busy")
    totals = s["kernel_totals"]
    # Totals are over every device: beside the run's span, a reader is told so.
    over = f" over {len(s['busy'])} GPUs" if len(s["busy"]) > 1 else ""
    if not s["kernels"]:
        console.print("no kernels in this run")
    else:
        names = "distinct names" if s["by"] == "name" else "distinct base names"
        title = (f"Top kernels by total time ({len(s['kernels'])} of {fmt.num(totals['names'])} {names}; "
                 f"{fmt.num(totals['count'])} launches, {fmt.ns(totals['total_ns'])}{over})")
        _stats_table(console, title, "kernel", s["kernels"], share=True)
    if s["graphs"]:
        _stats_table(console, "CUDA graph executions (not in the kernels' shares)", "graph",
                     s["graphs"], share=False)
    if s.get("graph_replays"):
        _graph_replays_table(console, s["graph_replays"])
    if s.get("phases"):
        one_stream = {d["device_id"] for d in s["budget"] if d.get("one_stream")}
        _phases_table(console, s["phases"], one_stream)
    if s.get("compiled_kernels"):
        _compiled_table(console, s["compiled_kernels"])
    if s["copies"]:
        rows = [[r["direction"], r["memory_kinds"], fmt.num(r["count"]), fmt.nbytes(r["bytes"]), fmt.ns(r["total_ns"]),
                 fmt.bandwidth(r["bandwidth_gb_per_s"])] for r in s["copies"]]
        _print_fit(console, [Column("direction"), Column("memory"),
                             *(Column(h, **num) for h in ("count", "bytes", "time", "bandwidth"))], rows,
                   title=f"Copies{over}")
    if s["memsets"]:
        rows = [[r["memory_kind"], fmt.num(r["count"]), fmt.nbytes(r["bytes"]), fmt.ns(r["total_ns"]),
                 fmt.bandwidth(r["bandwidth_gb_per_s"])] for r in s["memsets"]]
        _print_fit(console, [Column("memory"), *(Column(h, **num) for h in ("count", "bytes", "time", "bandwidth"))],
                   rows, title=f"Memsets{over}")
    if s["memory"]:
        _memory_tables(console, s["memory"])


def _compiled_table(console: Console, c: dict) -> None:
    """TorchInductor's kernels: per class, then the kernels by time with the operators each fused."""
    classes = ", ".join(f"{k['kernel_class'].replace('_', ' ')} {k['kernels']} ({fmt.ns(k['total_ns'])})"
                        for k in c["classes"])
    where = []
    if c["graphs"]:
        where.append(f"{len(c['graphs'])} compiled graph(s) ({', '.join(g[:8] for g in c['graphs'][:3])}"
                     f"{', ...' if len(c['graphs']) > 3 else ''})")
    if c["regions"]:
        where.append(", ".join(c["regions"][:3]) + (", ..." if len(c["regions"]) > 3 else ""))
    calls = f", {fmt.num(c['graph_calls'])} call(s)" if c["graph_calls"] else ""
    say(console, fmt.printable(
        f"Compiled kernels (TorchInductor): {c['kernels_n']} kernels, {fmt.num(c['count'])} launches, "
        f"{fmt.ns(c['total_ns'])} ({fmt.pct(c['share'])} of kernel time): {classes}"
        + (f"; in {'; '.join(where)}{calls}" if where else "")))
    num = {"justify": "right", "no_wrap": True}
    rows = [[cell(fmt.printable(r["name"])), r["kernel_class"].replace("_", " "),
             cell(", ".join(r["fused_ops"]) if r["fused_ops"] else "-"), fmt.num(r["count"]), fmt.ns(r["total_ns"]),
             fmt.pct(r["share"]), cell(fmt.text(r["config"]))] for r in c["kernels"]]
    columns = [Column("kernel", overflow="fold", min_width=20), Column("class"),
               Column("fused operators", overflow="fold", min_width=12),
               *(Column(h, **num) for h in ("count", "total", "share")), Column("config", overflow="fold")]
    title = f"Top compiled kernels by total time ({len(c['kernels'])} of {c['kernels_n']})"
    _print_fit(console, columns, rows, ("config", "class", "share"), title=title)


def _graph_replays_table(console: Console, rows: list[dict]) -> None:
    """Per graph replayed: replays, operations per replay, and per replay (the title says so) its
    kernel time, replay time (first operation's start to last one's end) and launch call, all
    means; then what a merged capture placed."""
    num = {"justify": "right", "no_wrap": True}
    merged = any(r["merged"] for r in rows)
    columns = [Column("graph", no_wrap=True), Column("device", **num),
               *(Column(h, **num) for h in ("replays", "ops/replay", "kernel time", "replay time", "launch call"))]
    if merged:
        columns.append(Column("placed", **num))
    out = []
    for r in rows:
        ops = str(r["min_ops"]) if r["min_ops"] == r["max_ops"] else f"{r['min_ops']}-{r['max_ops']}"
        if r["whole_graph"]:  # its kernels were not traced one by one
            ops = "whole graph"
        row = [r["graph"], fmt.text(r["device_id"]), fmt.num(r["replays"]), ops, fmt.ns(r["kernel_ns"] / r["replays"]),
               fmt.ns(r["avg_replay_ns"]), fmt.ns(r["avg_launch_ns"])]
        if merged:
            row.append(f"{fmt.num(r['placed'])}/{fmt.num(r['ops'])}")
        out.append(row)
    total = sum(r["replays"] for r in rows)
    _print_fit(console, columns, out, ("launch call",),
               title=f"Graph replays ({fmt.num(total)} {rows[0]['call_name']} calls; times per replay)")


def _phases_table(console: Console, rows: list[dict], one_stream: set = frozenset()) -> None:
    """Per inference phase: steps, requests, tokens, host time, kernel time (per token), the top
    kernel; then each phase's time budget and its top kernels."""
    num = {"justify": "right", "no_wrap": True}
    columns = [Column("phase", no_wrap=True),
               *(Column(h, **num) for h in ("steps", "requests", "tokens", "step time", "kernel time", "per token"))]
    out = [[r["phase"], fmt.num(r["steps"]), fmt.num(r["requests"]) if r["requests"] else "-",
            fmt.num(r["tokens"]) if r["tokens"] else "-", fmt.ns(r["wall_ns"]), fmt.ns(r["kernel_ns"]),
            fmt.ns(r["kernel_ns_per_token"]) if r["kernel_ns_per_token"] is not None else "-"] for r in rows]
    _print_fit(console, columns, out, ("requests",),
               title="Inference phases (the server's step annotations)")
    for r in rows:
        for device in r["budget"] or []:  # a phase's device is the run's: one stream or not
            device = {**device, "one_stream": device["device_id"] in one_stream}
            say(console, fmt.printable(f"{r['phase']}: {budget_line(device)}"))
        if r["top_kernels"]:
            top = ", ".join(f"{fmt.distinct_labels([k['name']], 50)[0]} {fmt.pct(k['share'])}" for k in r["top_kernels"][:3])
            say(console, fmt.printable(f"{r['phase']}: top kernels {top}"))


MEMORY_COLUMNS = (("reserved", "reserved_bytes"), ("allocated", "allocated_bytes"),
                  ("largest free block", "largest_free_block_bytes"), ("peak allocated", "peak_allocated_bytes"),
                  ("peak reserved", "peak_reserved_bytes"))


def _memory_tables(console: Console, rows: list[dict]) -> None:
    """Per device: a snapshot's reserved, allocated and largest free block, the peaks (the
    columns no device has left out); then, where the data has categories, what the peak held
    by category."""
    shown = [(h, k) for h, k in MEMORY_COLUMNS if any(r[k] is not None for r in rows)]
    sources = ", ".join(dict.fromkeys(r["source"] for r in rows))
    num = {"justify": "right", "no_wrap": True}
    _print_fit(console, [Column("device", no_wrap=True), *(Column(h, **num) for h, _ in shown)],
               [[str(r["device_id"]), *(fmt.nbytes(r[k]) for _, k in shown)] for r in rows],
               title=f"Memory ({sources})")
    if any(r["source"] == "memory snapshot" and r["peak_allocated_bytes"] is not None for r in rows):
        say(console, "Reserved, allocated and the largest free block are at the snapshot; the peaks are over its "
                     "recorded history, allocated in the bytes requested (blocks round them up).")
    for r in rows:
        if r["categories"]:
            _print_fit(console, [Column("category"), Column("bytes", **num), Column("share", **num)],
                       [[x["category"].replace("_", " "), fmt.nbytes(x["bytes"]), fmt.pct(x["share"])]
                        for x in r["categories"]],
                       title=f"Device {r['device_id']} at its peak ({fmt.nbytes(r['peak_allocated_bytes'])}), by category")


def _print_fit(console: Console, columns: list, rows: list, optional=(), **table_args) -> None:
    """A table laid out to fit (`fit_table`), and the line naming the columns it left out."""
    t, dropped = fit_table(console, columns, rows, optional, **table_args)
    console.print(t)
    left_out(console, dropped, "; --format json has every column")


def _stats_table(console: Console, title: str, what: str, rows: list[dict], share: bool) -> None:
    """Rows of kernel statistics, each name shortened to fit and kept apart from the others
    (`distinct_labels`): in the table when the console leaves it room, else numbered, with the
    names on a line each under the table."""
    headers = ["count", "total", "avg", "median", "min", "max", "stddev"] + (["share"] if share else [])
    values = [[fmt.num(r["count"]), *(fmt.ns(r[k]) for k in ("total_ns", "avg_ns", "median_ns", "min_ns",
                                                             "max_ns", "stddev_ns"))]
              + ([fmt.pct(r["share"])] if share else []) for r in rows]
    names = [fmt.printable(r["name"]) for r in rows]
    # A rich table column takes its text plus a space either side and a border.
    fixed = sum(max(len(h), *(len(v[i]) for v in values)) + 3 for i, h in enumerate(headers)) + 1
    room = console.width - fixed - 3
    in_table = room >= min(MIN_NAME_WIDTH, max(len(n) for n in names))
    numbers = [Column(h, no_wrap=True, justify="right") for h in headers]
    say(console, title)  # (above the table, wrapped between words: a rich title is not)
    if in_table:
        t = Table(Column(what, overflow="fold", max_width=room), *numbers)
        for label, v in zip(fmt.distinct_labels(names, room), values):
            t.add_row(Text(label), *v)
        console.print(t)
        return
    # Without the outer borders and paddings, the numbers fit in 80 columns.
    t = Table(Column("#", no_wrap=True), *numbers, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, v in enumerate(values, 1):
        t.add_row(str(i), *v)
    console.print(t)
    digits = len(str(len(rows)))
    room = console.width - digits - 2
    for i, label in enumerate(fmt.distinct_labels(names, room), 1):
        # A name kept whole (two labels came out the same) wraps under itself.
        for j in range(0, len(label), room):
            console.print(f"{str(i) if j == 0 else '':>{digits}}  {label[j:j + room]}", markup=False)
