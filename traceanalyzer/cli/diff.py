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
from rich.table import Column

from .common import PIPED_WIDTH, StoreOpt, cell, err, fit_table, left_out, open_store, out, say


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

    Exit 0; 1 when --gate is exceeded or the comparison is inconclusive (unless
    --allow-different-hardware for runs not alike); 2 on unreadable input or a usage error."""
    from ..diff import DiffError, diff_runs

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
    gate_line = None if result is None else f"gate {gate:g}%: " + _gate_words(result)
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
            _print(console, d, top, noise)
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


def _gate_words(result: dict) -> str:
    """'pass', or 'FAIL: ' and what failed it (an inconclusive comparison fails)."""
    if result["passed"]:
        return "pass"
    why = list(result["failures"])
    if result["inconclusive"]:
        why.insert(0, "inconclusive comparison (reasons on stderr)")
    return "FAIL: " + "; ".join(why)


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


_PROFILED = {"sm_pct": "SM %", "memory_pct": "memory %", "achieved_occupancy_pct": "occupancy %"}


def _pct_pair(base, test) -> str:
    show = lambda v: "-" if v is None or v != v else f"{v:.0f}"  # noqa: E731
    return f"{show(base)} -> {show(test)}"


def _fmt_pct(v) -> str:
    from .. import fmt

    return "-" if fmt._missing(v) else f"{v:+.1f}%"


def _fmt_delta(v, show) -> str:
    from .. import fmt

    return "-" if fmt._missing(v) else ("+" if v > 0 else "") + show(v)


def _print(console: Console, d, top: int, noise: float) -> None:
    from .. import fmt

    from ..diff import show_delta, show_value

    b, t = d.base, d.test
    if not d.comparable:
        say(console, "INCONCLUSIVE: the runs are not alike; the numbers below are as measured, not judged:")
        for r in d.reasons:
            say(console, f"  {r}")
    console.print(f"base {b['run_id']}  {b['file_name']}  ({b['format']})", markup=False)
    console.print(f"test {t['run_id']}  {t['file_name']}  ({t['format']})", markup=False)

    rows = []
    for x in [*d.metrics, *([d.peak_memory] if d.has_memory else [])]:
        show = show_value(x.unit)
        mark = " (verdict)" if x is d.end_to_end else ""
        rows.append([x.name + mark, show(x.base), show(x.test), show_delta(x.unit)(x.delta), _fmt_pct(x.delta_pct)])
    _table(console, [Column("end to end"), "base", "test", "change", ""], rows,
           title="End-to-end time and memory" if d.has_memory else "End-to-end time")
    _print_steps(console, d)
    _print_step_budget(console, d)
    if len(d.busy) > 1 or (d.busy["base_device_id"] != d.busy["test_device_id"]).any():
        share = show_value("share")
        _table(console, ["device", "base busy", "test busy", "base idle", "test idle"],
               [[_device(r), fmt.ns(r.base_busy_ns), fmt.ns(r.test_busy_ns), share(r.base_idle_share),
                 share(r.test_idle_share)] for r in d.busy.itertuples()],
               title="GPU busy per device (union of its GPU work)")
    skipped = {k: v for k, v in d.not_counted.items() if v}
    if skipped:
        say(console, "not counted (launched before the capture began): "
            + ", ".join(f"{k} {v} kernel(s)" for k, v in skipped.items()))

    if not d.kernels.empty:  # (memory snapshots and timelines have none)
        # Nsight Compute profiles: each kernel's Speed Of Light and achieved occupancy, base -> test
        profiled = [c for c in ("sm_pct", "memory_pct", "achieved_occupancy_pct")
                    if d.kernels[[f"base_{c}", f"test_{c}"]].notna().any().any()]
        paired = (d.kernels["status"] == "paired").any()
        rows = []
        for r in d.kernels.head(top).itertuples():
            name = r.short_name if d.match_by == "short" else r.name
            if r.status == "paired":
                from ..ingest.kineto_names import kernel_short_name

                name = (f"{fmt.kernel_label(r.name, kernel_short_name(r.name))} -> "
                        f"{fmt.kernel_label(r.test_name, kernel_short_name(r.test_name))}")
            count = (f"{fmt.num(r.base_count)} -> {fmt.num(r.test_count)}" if r.status in ("both", "paired")
                     else r.status)
            rows.append([cell(_clip(name)), count, fmt.ns(r.base_total_ns), fmt.ns(r.test_total_ns),
                         _fmt_delta(r.delta_ns, fmt.ns), _fmt_pct(r.delta_pct),
                         *(_pct_pair(getattr(r, f"base_{c}"), getattr(r, f"test_{c}")) for c in profiled)])
        _table(console, [_name_column("kernel"), "count", "base", "test", "change", "",
                         *(_PROFILED[c] for c in profiled)], rows,
               optional=[_PROFILED[c] for c in reversed(profiled)],
               title=f"Kernels by time change (top {min(top, len(d.kernels))} of {len(d.kernels)}, matched by "
                     f"{d.match_by}{', renamed kernels paired in launch order' if paired else ''})")

    if not d.ranges.empty:
        _table(console, [_name_column("range"), "side", "count", "base mean", "test mean", "change"],
               [[cell(_clip(r.range)), r.side, f"{fmt.num(r.base_count)} -> {fmt.num(r.test_count)}",
                 fmt.ns(r.base_mean_ns), fmt.ns(r.test_mean_ns), _fmt_pct(r.mean_delta_pct)]
                for r in d.ranges.head(top).itertuples()],
               title=f"Steps and ranges (top {min(top, len(d.ranges))} of {len(d.ranges)})")

    if not d.operators.empty:
        per_step = "base_per_step_ns" in d.operators
        rows = []
        for r in d.operators.head(top).itertuples():
            base, test = (r.base_per_step_ns, r.test_per_step_ns) if per_step else (r.base_total_ns, r.test_total_ns)
            change = None if fmt._missing(base) or not base or fmt._missing(test) else 100 * (test - base) / base
            rows.append([cell(_clip(r.operator)), f"{fmt.num(r.base_count)} -> {fmt.num(r.test_count)}", fmt.ns(base),
                         fmt.ns(test),
                         _fmt_delta(None if fmt._missing(base) or fmt._missing(test) else test - base, fmt.ns),
                         _fmt_pct(change)])
        _table(console, [_name_column("operator"), "count", "base", "test", "change", ""], rows,
               title=f"PyTorch operators by host-time change ({'per step, ' if per_step else ''}"
                     f"top {min(top, len(d.operators))} of {len(d.operators)})")

    if d.has_memory:
        _print_memory(console, d)

    for title, rows in (("New findings", d.new_findings), ("Fixed findings", d.fixed_findings)):
        if rows:
            console.print(f"{title} ({len(rows)}):", markup=False)
            for f in rows[:top]:
                say(console, fmt.printable(f"  {f['severity']:<7} {f['rule_id']} {f['message']}"))
            if len(rows) > top:
                console.print(f"  ... and {len(rows) - top} more (--json lists all)", markup=False)
    word, line = d.verdict(noise)
    console.print(f"verdict: {line}", markup=False)  # one line, as the log gets it


def _print_steps(console: Console, d) -> None:
    """Each run's per-step time distribution, when either has steps."""
    from .. import fmt

    if not any(d.steps.values()):
        return
    rows = []
    for side in ("base", "test"):
        s = d.steps[side]
        if s is None:
            rows.append([side, "-", "-", "-", "-", "-", "-", "-"])
            continue
        outliers = ", ".join(f"#{o['index']} {fmt.ns(o['ns'])}" for o in s["outliers"][:5]) or "-"
        rows.append([f"{side} ({s['step']})", str(s["steps"]), str(s["warmup_steps"]), fmt.ns(s["median_ns"]),
                     fmt.ns(s["p90_ns"]), fmt.ns(s["min_ns"]), fmt.ns(s["max_ns"]), outliers])
    # An outlier is its step number and time: the list breaks after a comma, never inside one.
    rows = [[*r[:-1], r[-1].replace(", ", ",\n") if len(r[-1]) > 24 else r[-1]] for r in rows]
    _table(console, [Column("steps"), "count", "warm-up", "median", "p90", "min", "max", "outliers"], rows,
           title="Per-step time")


def _print_step_budget(console: Console, d) -> None:
    """Each device's time budget per step, base against test, when both runs have steps."""
    from .. import fmt

    if d.step_budget.empty:
        return
    rows = []
    for r in d.step_budget.itertuples():
        part = r.category if fmt._missing(r.cause) else f"{r.category}: {r.cause}"
        rows.append([_device(r), part, fmt.ns(r.base_per_step_ns), fmt.ns(r.test_per_step_ns),
                     _fmt_delta(r.delta_ns, fmt.ns)])
    _table(console, ["device", Column("part"), "base per step", "test per step", "change"], rows,
           title="Time budget per step (mean over the steady steps)")


def _print_memory(console: Console, d) -> None:
    """Peak allocated (and reserved) memory per device, the peak by category where both runs
    have categories, and the line that sums it up."""
    from .. import fmt

    reserved = d.memory[["base_peak_reserved_bytes", "test_peak_reserved_bytes"]].notna().any().any()
    rows = []
    for r in d.memory.itertuples():
        sources = dict.fromkeys(fmt.text(x) for x in (r.base_source, r.test_source) if fmt.text(x) != "-")
        rows.append([_device(r), fmt.nbytes(r.base_peak_bytes), fmt.nbytes(r.test_peak_bytes),
                     _fmt_delta(r.delta_bytes, fmt.nbytes), _fmt_pct(r.delta_pct),
                     *([fmt.nbytes(r.base_peak_reserved_bytes), fmt.nbytes(r.test_peak_reserved_bytes)] if reserved
                       else []),
                     " / ".join(sources) or "-"])
    _table(console, ["device", "base peak", "test peak", "change", "",
                     *(["base peak reserved", "test peak reserved"] if reserved else []), Column("from")], rows,
           title="Peak memory per device (allocated; reserved where recorded)")
    for gpu in dict.fromkeys(d.memory_categories["gpu"]):
        rows = d.memory_categories[d.memory_categories["gpu"] == gpu]
        _table(console, [Column("category"), "base", "test", "change", ""],
               [[r.category.replace("_", " "), fmt.nbytes(r.base_bytes), fmt.nbytes(r.test_bytes),
                 _fmt_delta(r.delta_bytes, fmt.nbytes), _fmt_pct(r.delta_pct)] for r in rows.itertuples()],
               title=f"Device {_device(next(rows.itertuples()))} at the peak, by category")
    say(console, f"memory: {d.memory_line()}")


def _name_column(header: str) -> Column:
    """A kernel, range or operator name: folded onto more lines where the numbers need the room."""
    return Column(header, overflow="fold", min_width=24)


def _table(console: Console, columns: list, rows: list, optional=(), **table_args) -> None:
    """A table of `columns` (a header is a column of values kept whole) laid out for the console's
    width (`fit_table`), and the line naming the columns it left out."""
    t, dropped = fit_table(console, [c if isinstance(c, Column) else Column(c, no_wrap=True) for c in columns],
                           rows, optional, **table_args)
    console.print(t)
    left_out(console, dropped, "; --json has every column")


def _device(row) -> str:
    """A per-device row's device: its id, or 'BASE -> TEST' where the runs' ids for the role differ."""
    from .. import fmt

    b, t = row.base_device_id, row.test_device_id
    if fmt._missing(b) and fmt._missing(t):
        return "-"
    if fmt._missing(b) or fmt._missing(t):
        return f"{t} (test only)" if fmt._missing(b) else f"{b} (base only)"
    return str(b) if b == t else f"{b} -> {t}"


def _clip(s, n: int = 90) -> str:
    from .. import fmt

    s = fmt.text(s, "?")
    return s if len(s) <= n else s[: n - 1] + "…"


def register(app: typer.Typer) -> None:
    app.command()(diff)
