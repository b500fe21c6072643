"""The time budget of a run (the `time_budget` view) as reports hold and print it.

Each device's span (first GPU operation's start to last one's end) in exclusive parts:
compute, communication, copy, memset, and idle by cause. JSON keeps the shape other tools
read: per device `{"device_id", "span_ns", "parts": [{"category", "cause", "ns"}]}`, plus
`host_work` (`{"name", "kind", "ns"}`) when the run's host-bound finding names what the host did,
and `warmup` (see `_add_warmup`) when part of the span is warm-up or one-time costs
(`warmup_windows`): the parts are the whole span's, warm-up included; the findings weigh the
steady state (the span less warm-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import fmt
from ..rules import evidence_of
from ..analyses.budget import BUDGET_CATEGORIES

if TYPE_CHECKING:
    from ..store import Store

_WORDS = {"compute": "compute", "communication": "communication", "copy": "copies", "memset": "memsets"}


def budget_of(store: Store, run_id: str) -> list[dict]:
    """The run's budget, one entry per device (none: the run has no timed GPU operation)."""
    return budgets_of(store, [run_id])[run_id]


def budgets_of(store: Store, run_ids: list[str]) -> dict[str, list[dict]]:
    """`budget_of` of each run, in one query."""
    rows = sorted(store.time_budget(list(run_ids)), key=lambda r: (r["device_id"] is None, r["device_id"] or 0))
    out: dict[str, dict] = {r: {} for r in run_ids}
    for r in rows:
        d = out[r["run_id"]].setdefault(r["device_id"], {"device_id": r["device_id"], "span_ns": r["span_ns"], "parts": []})
        d["parts"].append({"category": r["category"], "cause": r["cause"], "ns": r["ns"]})
    for devices in out.values():
        for d in devices.values():
            d["parts"].sort(key=_part_order)
    # What the host did in the idle time, where the run's host-bound finding (T004) says: the
    # host activity behind most of the stretches in which every GPU was idle (a DataLoader, an
    # operator, a range), on each device.
    for run_id, evidence in store.sql(
            "SELECT run_id, evidence FROM findings "
            "WHERE rule_id = 'T004' AND list_contains(?::VARCHAR[], run_id)", [list(run_ids)]).fetchall():
        ev = evidence_of("T004", evidence)
        work = ev.top_activity[0] if ev is not None and ev.top_activity else None
        for d in out[run_id].values() if work else ():
            d["host_work"] = {"name": work.name, "kind": work.kind, "ns": work.ns}
    # A device whose every operation ran on one stream: there the time its issued work waited
    # (the budget's `dependency`) had no other stream or event to wait for; it is launch latency.
    for run_id, device_id in store.sql(
            "SELECT run_id, device_id FROM gpu_activity WHERE list_contains(?::VARCHAR[], run_id) "
            "GROUP BY ALL HAVING min(stream_id) = max(stream_id) AND count(stream_id) = count(*)",
            [list(run_ids)]).fetchall():
        if device_id in out[run_id]:
            out[run_id][device_id]["one_stream"] = True
    _add_warmup(store, out)
    return {r: list(devices.values()) for r, devices in out.items()}


def _add_warmup(store: Store, out: dict[str, dict]) -> None:
    """Each device's `warmup` (`warmup_windows`, `run_warmup_budget`), where it has some:
    `{"ns", "steady_span_ns", "reasons": [...], "parts": [{"category", "cause", "ns"}]}`, the
    reasons by the time their windows cover, most first."""
    windows, parts = store.warmup([r for r, devices in out.items() if devices])
    for r in parts:
        d = out[r["run_id"]].get(r["device_id"])
        if d is not None:
            w = d.setdefault("warmup", {"ns": 0, "parts": [], "reasons": []})
            w["ns"] += r["ns"]
            w["parts"].append({"category": r["category"], "cause": r["cause"], "ns": r["ns"]})
    covered: dict[tuple, list] = {}
    for w in windows:
        covered.setdefault((w["run_id"], w["device_id"], w["reason"]), []).append((w["start_ns"], w["end_ns"]))
    for (run_id, device_id, reason), spans in sorted(covered.items(), key=lambda kv: -_union(kv[1])):
        d = out[run_id].get(device_id)
        if d is not None and "warmup" in d:
            d["warmup"]["reasons"].append(reason)
    for devices in out.values():
        for d in devices.values():
            if "warmup" in d:
                d["warmup"]["parts"].sort(key=_part_order)
                d["warmup"]["steady_span_ns"] = (d["span_ns"] or 0) - d["warmup"]["ns"]


def _union(spans: list[tuple[int, int]]) -> int:
    """The time a list of intervals covers."""
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def step_budgets_of(store: Store, run_id: str) -> dict:
    """The run's budget per step (`run_step_budget`), per device in step order:
    {device_id: [{"step", "start_ns", "span_ns", "parts": [{"category", "cause", "ns"}]}]};
    empty when the run has no steps."""
    return step_budgets_of_runs(store, [run_id])[run_id]


# Of the runs in a query of `step_budgets_of_runs`, the GPU operations at most (a run with more is alone).
STEP_BUDGET_OPS_PER_QUERY = 1_000_000


def step_budgets_of_runs(store: Store, run_ids: list[str]) -> dict[str, dict]:
    """`step_budgets_of` of each run, the runs with steps in a few queries (one query per run
    costs ~30 ms of planning, however small the run)."""
    from ..analyses.budget import step_budget_sql

    out: dict[str, dict] = {r: {} for r in run_ids}
    sizes = store.sql("""
        SELECT s.run_id, (SELECT count(*) FROM gpu_activity a WHERE a.run_id = s.run_id)
        FROM (SELECT DISTINCT run_id FROM steps WHERE list_contains($ids, run_id)) s ORDER BY s.run_id""",
                      {"ids": list(run_ids)}).fetchall()
    sql = (f"SELECT run_id, device_id, step_id, step, step_start_ns, span_ns, category, cause, ns "
           f"FROM ({step_budget_sql('list_contains($ids, run_id)')}) "
           "ORDER BY run_id, device_id NULLS LAST, step_start_ns, step_id")
    batches: list[list[str]] = []
    ops = 0
    for run_id, n in sizes:
        if not batches or ops + n > STEP_BUDGET_OPS_PER_QUERY:
            batches.append([])
            ops = 0
        batches[-1].append(run_id)
        ops += n
    for batch in batches:
        per_run: dict[str, dict] = {}
        for run_id, device_id, step_id, step, start, span, category, cause, ns in store.sql(sql, {"ids": batch}).fetchall():
            steps = per_run.setdefault(run_id, {}).setdefault(device_id, {})
            entry = steps.setdefault(step_id, {"step": step, "start_ns": start, "span_ns": span, "parts": []})
            entry["parts"].append({"category": category, "cause": cause, "ns": ns})
        for run_id, devices in per_run.items():
            for steps in devices.values():
                for entry in steps.values():
                    entry["parts"].sort(key=_part_order)
            out[run_id] = {d: list(steps.values()) for d, steps in devices.items()}
    return out


def _part_order(p: dict) -> tuple:
    """Busy parts in priority order, then idle by time; ties by name, so the order is total."""
    return (p["category"] == "idle",
            BUDGET_CATEGORIES.index(p["category"]) if p["category"] in BUDGET_CATEGORIES else 0, -p["ns"],
            p["category"], p["cause"] is None, p["cause"] or "")


def busy_split(device: dict) -> dict[str, int]:
    """A device's busy time in the budget's exclusive parts: kernels (compute and
    communication), copies and memsets; they sum to its busy time (`device_busy`)."""
    ns = {p["category"]: p["ns"] for p in device["parts"] if p["category"] != "idle"}
    return {"kernels": ns.get("compute", 0) + ns.get("communication", 0), "copies": ns.get("copy", 0),
            "memsets": ns.get("memset", 0)}


def _pct(ns: int, span: int) -> str:
    share = ns / span if span else 0.0
    return "<1%" if 0 < share < 0.005 else f"{share:.0%}"


def budget_line(device: dict) -> str:
    """'GPU 0 (span 1.07 s): 61% compute, 5% copies, 34% idle: host 21% (15% in range
    "enumerate(DataLoader)..."), sync 7%, dependency 4%, unknown 2%' ('launch latency' for
    dependency on a device that ran one stream). The span is said here once: every share of the
    device's time, in the budget and in the findings, is of it."""
    span = device["span_ns"] or 0
    parts = sorted(device["parts"], key=_part_order)  # (a phase's or a step's parts come in any order)
    busy = [p for p in parts if p["category"] != "idle"]
    idle = [p for p in parts if p["category"] == "idle" and p["ns"] > 0]
    words = [f"{_pct(p['ns'], span)} {_WORDS.get(p['category'], p['category'])}"
             for p in busy if p["ns"] > 0 or p["category"] == "compute"]
    idle_ns = sum(p["ns"] for p in idle)
    text = (f"GPU {'?' if device['device_id'] is None else device['device_id']} (span {fmt.ns(span)}): "
            + ", ".join(words))
    if idle_ns:
        text += f", {_pct(idle_ns, span)} idle: " + ", ".join(
            f"{cause_words(p['cause'], bool(device.get('one_stream')))} {_pct(p['ns'], span)}{_host_work(device, p)}"
            for p in idle)
    return text


def cause_words(cause: str | None, one_stream: bool) -> str:
    """An idle part's cause as the budget line, the bars and the phase lines say it: `dependency`
    on a one-stream device is the launch latency (from a launch call's return to its kernel's
    start), with nothing to wait for."""
    return "launch latency" if cause == "dependency" and one_stream else str(cause)


def warmup_line(device: dict) -> str | None:
    """'warm-up: 12.8 s of the span (range named warm-up, cudaFree, first launch), not counted
    in the findings; steady 83 ms'; None without warm-up."""
    w = device.get("warmup")
    if not w or not w["ns"]:
        return None
    return (f"warm-up: {fmt.ns(w['ns'])} of the span ({', '.join(w['reasons'])}), not counted in the findings; "
            f"steady {fmt.ns(w['steady_span_ns'])}")


def budget_lines(device: dict) -> list[str]:
    """A device's budget line, and its warm-up line when it has one."""
    return [budget_line(device), *filter(None, [warmup_line(device)])]


HOST_WORK_KINDS = {"cpu_op": "operator", "api_call": "API call", "range": "range"}


def _host_work(device: dict, part: dict) -> str:
    work = device.get("host_work")
    if part["cause"] != "host" or not work:
        return ""
    name = work["name"] if len(work["name"]) <= 60 else work["name"][:59] + "…"
    # what the name is (a range "IO N" reads as a label otherwise), as T004's message says it
    return f" ({_pct(work['ns'], device['span_ns'] or 0)} in {HOST_WORK_KINDS.get(work.get('kind'), 'range')} \"{name}\")"


def budget_cell(budget: list[dict]) -> str:
    """The budget of a run in a table cell: of the device with the longest span, its largest
    busy part and its idle share with the main cause ('59% compute · 39% idle, host'); '-'
    without one."""
    if not budget:
        return "-"
    device = max(budget, key=lambda d: d["span_ns"] or 0)
    span = device["span_ns"] or 0
    busy = max((p for p in device["parts"] if p["category"] != "idle"), key=lambda p: p["ns"], default=None)
    idle = [p for p in device["parts"] if p["category"] == "idle" and p["ns"] > 0]
    text = f"{_pct(busy['ns'], span)} {_WORDS.get(busy['category'], busy['category'])}" if busy and busy["ns"] else ""
    if idle:
        main = max(idle, key=lambda p: p["ns"])
        text += (" · " if text else "") + f"{_pct(sum(p['ns'] for p in idle), span)} idle, {main['cause']}"
    return text or "-"


def without_kernels_line(facts: dict | None) -> str | None:
    """What a timeline with no kernel holds instead (`summary.without_kernels`), and what it
    means: API calls that launch nothing (the capture ends in the program's set-up), launches
    whose work is not in the trace (activity not recorded), or host operators alone (no GPU
    traced); None when it holds none of them."""
    if not facts:
        return None
    gpu = [f"{num} {what}{'s' if num != 1 else ''}" for num, what in
           ((facts["copies"], "copy"), (facts["memsets"], "memset")) if num]
    if facts["calls"]:
        calls = ", ".join(f"{c['name']} {fmt.ns(c['ns'])}" for c in facts["top_calls"] or [])
        held = f"{facts['calls']:,} API call{'s' if facts['calls'] != 1 else ''} over {fmt.ns(facts['calls_span_ns'] or 0)}"
        if facts["launches"]:
            return (f"no kernel in the trace, though {facts['launches']:,} of its {held} launch work or copy: "
                    "the work they launched was not recorded (kernel tracing off, or a counter mode such as "
                    "CUPTI's profiler)")
        return (f"no kernel ran: the capture holds {held}, none a launch or copy ({calls})"
                + (f", and {' and '.join(gpu)}" if gpu else "")
                + ": it ends in the program's CUDA set-up, or the program ran no GPU work; profile past the "
                  "set-up (nsys --delay, or --capture-range=cudaProfilerApi around the work to judge)")
    if facts["operators"]:
        return (f"no GPU work: the trace holds {facts['operators']:,} host operators and no GPU activity or API "
                "calls (a process that used no GPU, or GPU activity not traced: torch.profiler without "
                "ProfilerActivity.CUDA)")
    return None


def no_budget_line(run: dict) -> str:
    """What a run without a budget says instead."""
    if run.get("span_ns") is not None:
        return "no timed GPU operations: no time budget"
    if run.get("clock") == "none":  # a profiler that replays kernels one at a time, off any timeline
        return ("no timeline: the trace holds no event times (Nsight Compute profiles kernels one at a time), "
                "so there is no time budget")
    return "no timeline: the capture recorded no timed events, so there is no time budget"
