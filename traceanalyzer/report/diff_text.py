"""`traceanalyzer diff` as text: the comparison's tables (end-to-end time and memory, steps,
step budget, GPU busy, kernels, ranges, operators, memory by category), its findings and its
verdict line, laid out for the console's width."""

from __future__ import annotations

from rich.console import Console
from rich.table import Column

from .. import fmt
from ..diff import RunDiff, show_delta, show_value
from .terminal import cell, fit_table, left_out, say


def gate_words(result: dict) -> str:
    """'pass', or 'FAIL: ' and what failed it (an inconclusive comparison fails)."""
    if result["passed"]:
        return "pass"
    why = list(result["failures"])
    if result["inconclusive"]:
        why.insert(0, "inconclusive comparison (reasons on stderr)")
    return "FAIL: " + "; ".join(why)


_PROFILED = {"sm_pct": "SM %", "memory_pct": "memory %", "achieved_occupancy_pct": "occupancy %"}


def _pct_pair(base, test) -> str:
    show = lambda v: "-" if v is None or v != v else f"{v:.0f}"  # noqa: E731
    return f"{show(base)} -> {show(test)}"


def _fmt_pct(v) -> str:
    return "-" if fmt._missing(v) else f"{v:+.1f}%"


def _fmt_delta(v, show) -> str:
    return "-" if fmt._missing(v) else ("+" if v > 0 else "") + show(v)


def print_diff(console: Console, d: RunDiff, top: int, noise: float) -> None:
    """A comparison (`diff.diff_runs`) as text, laid out for the console's width: `top` rows a
    table; changes under `noise` percent count as none in the verdict line."""
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
    b, t = row.base_device_id, row.test_device_id
    if fmt._missing(b) and fmt._missing(t):
        return "-"
    if fmt._missing(b) or fmt._missing(t):
        return f"{t} (test only)" if fmt._missing(b) else f"{b} (base only)"
    return str(b) if b == t else f"{b} -> {t}"


def _clip(s, n: int = 90) -> str:
    s = fmt.text(s, "?")
    return s if len(s) <= n else s[: n - 1] + "…"
