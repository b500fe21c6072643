"""What a trace lacks to say why the GPU sat idle: read by rule T010 (a sampled or stripped
trace) and by the idle-cause rules (T001, T003, T004, T006), which then abstain.

An idle cause is read from the operation that ends an idle stretch and its launch call (the
time budget, the macro `idle_issued_at`). Two things make that reading a guess:

* **The trace is sampled or stripped** (`gaps`): GPU operations that follow a launched one on
  their stream yet have no launch call of their own (a stream runs its work in launch order,
  so their launches happened inside the recorded window and were dropped); operator ids
  (`External id`, numbered in order by the profiler) that skip most numbers, regularly; or no
  launch call at all. Between the recorded operations ran others the trace no longer holds:
  its idle stretches are not known to be idle, let alone why.
* **The host waited on work the trace does not show** (`unseen_waits`): every GPU idle, the
  work that ends the stretch already issued, and the host inside a blocking call (a
  synchronize, a copy that is not Async). A blocking call returns when the GPU work it waits
  for is done; with no GPU work running, what it (and the issued work) waited for is not in
  the trace: an event of another stream or process, work of an untraced process, the driver.

A finding that abstains keeps its measured figures and says `"cause": "unknown"` with
`"missing"` (what the trace lacks and how to record it) in its evidence, and a hint that
says so instead of a fix (`abstain`): one shape for every rule, which the reports lift out
(report/json_report.py, report/text.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..analyses.budget import BLOCKING_CALL
from ..store import run_cache

if TYPE_CHECKING:
    import pandas as pd

    from ..store import Store

CAUSE_UNKNOWN = "unknown"

# GPU operations per stream in launch order; those after the stream's first launched one that
# have no launch call were launched inside the recording and lost (unified-memory migrations
# have no launch: left out). Operations before it may have been launched before the recording
# began (a queue runs behind the host by up to seconds): they say nothing.
GAPS_SQL = """
WITH ops AS (
    SELECT coalesce(device_id, -1) AS d, coalesce(stream_id, -1) AS s, start_ns, launch_call_id IS NOT NULL AS launched
    FROM gpu_activity WHERE run_id = $run_id AND NOT unified_memory
), firsts AS (  -- per stream, its first launched operation (an aggregate and a hash join: no sort)
    SELECT d, s, min(start_ns) FILTER (WHERE launched) AS first_launched FROM ops GROUP BY ALL
), launches AS (
    SELECT count(*) AS gpu_ops, count(*) FILTER (WHERE launched) AS launched,
           count(*) FILTER (WHERE o.start_ns > f.first_launched) AS after_launched,
           count(*) FILTER (WHERE o.start_ns > f.first_launched AND NOT launched) AS unlaunched
    FROM ops o JOIN firsts f USING (d, s)
), ids AS (  -- the operators' ids in order: a complete trace skips few (ops outside the window)
    SELECT count(*) + 1 AS ops, count(*) FILTER (WHERE x - px > 1) AS jumps, coalesce(sum(x - px - 1), 0) AS skipped
    FROM (SELECT x, lag(x) OVER (ORDER BY x) AS px
          FROM (SELECT DISTINCT external_id AS x FROM cpu_ops WHERE run_id = $run_id AND external_id IS NOT NULL
                  -- not the operators a capture merge copied in (store/capture_merge.py): they carry the
                  -- capture's ids and lie before the run's own events
                  AND NOT (end_ns < (SELECT min(start_ns) FROM api_calls WHERE run_id = $run_id)
                           AND EXISTS (SELECT 1 FROM graph_nodes WHERE run_id = $run_id AND placed))))
    WHERE px IS NOT NULL
)
SELECT l.gpu_ops, l.launched, l.after_launched, l.unlaunched, i.ops, i.jumps, i.skipped,
       (SELECT count(*) FROM cpu_ops WHERE run_id = $run_id) AS cpu_ops
FROM launches l, ids i
"""

# Of every stretch with no GPU busy, the part after the work that ends it was issued (the return
# of its launch call, as the budget reads it), covered by blocking calls of any thread (merged:
# calls of several threads count once).
UNSEEN_SQL = f"""
WITH gaps AS (
    SELECT start_ns, end_ns FROM this_run.run_idle_gaps
), issued AS (
    SELECT g.start_ns, g.end_ns, min(coalesce(c.end_ns, c.start_ns)) AS issued_ns
    FROM gaps g JOIN gpu_activity a ON a.run_id = $run_id AND a.start_ns = g.end_ns
    JOIN api_calls c ON c.run_id = $run_id AND c.call_id = a.launch_call_id
    GROUP BY ALL
), waits AS (
    SELECT greatest(issued_ns, start_ns) AS s, end_ns AS e FROM issued WHERE issued_ns < end_ns
), blocking AS (
    SELECT name, start_ns, end_ns,
           max(end_ns) OVER (ORDER BY start_ns, end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM api_calls WHERE run_id = $run_id AND {BLOCKING_CALL} AND end_ns > start_ns
), islands AS (
    SELECT min(start_ns) AS s, max(end_ns) AS e, arg_max(name, end_ns - start_ns) AS name
    FROM (SELECT *, sum(CASE WHEN reach >= start_ns THEN 0 ELSE 1 END) OVER (ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
          FROM blocking)
    GROUP BY island
), hit AS (
    SELECT b.name, least(b.e, w.e) - greatest(b.s, w.s) AS ns, greatest(b.s, w.s) AS s, least(b.e, w.e) AS e
    FROM waits w JOIN islands b ON b.s < w.e AND b.e > w.s
)
SELECT name, sum(ns) AS ns, count(*) AS stretches, arg_max(s, ns) AS worst_start_ns, arg_max(e, ns) AS worst_end_ns
FROM hit GROUP BY name ORDER BY ns DESC, name
"""

# Stream waits on an event that no call in the trace recorded (they come before its first event
# record): what recorded it ran before the trace began, and GPU work launched before a trace is
# not in it, yet runs in it. The first GPU operation the waiting thread launched after such a
# wait is held by that work; where it ends a device-idle stretch, the stretch may be that work
# running, not idle time.
_PRETRACE_WAITS = """waits AS (
    SELECT pid, tid, start_ns FROM api_calls
    WHERE run_id = $run_id AND regexp_matches(name, '(?i)StreamWaitEvent') AND pid IS NOT NULL AND tid IS NOT NULL
      AND start_ns < (SELECT coalesce(min(start_ns), 9223372036854775807) FROM api_calls
                      WHERE run_id = $run_id AND regexp_matches(name, '(?i)EventRecord'))
)"""
PRETRACE_WAITS_SQL = f"WITH {_PRETRACE_WAITS} SELECT count(*) FROM waits"
PRETRACE_SQL = f"""
WITH {_PRETRACE_WAITS}, launches AS (  -- (the threads that waited only)
    SELECT c.pid, c.tid, c.start_ns, a.device_id, a.start_ns AS op_start_ns
    FROM gpu_activity a JOIN api_calls c ON c.run_id = $run_id AND c.call_id = a.launch_call_id
    WHERE a.run_id = $run_id AND (c.pid, c.tid) IN (SELECT (pid, tid) FROM waits)
), held AS (  -- each wait's first launch after it (an ASOF join: the launches of its thread)
    SELECT DISTINCT l.device_id, l.op_start_ns
    FROM waits w ASOF JOIN launches l ON l.pid = w.pid AND l.tid = w.tid AND l.start_ns > w.start_ns
)
SELECT g.device_id, g.start_ns, g.end_ns
FROM this_run.device_idle_gaps g JOIN held h ON h.device_id IS NOT DISTINCT FROM g.device_id AND h.op_start_ns = g.end_ns
ORDER BY g.device_id, g.start_ns
"""

HOW_TO_RECORD = ("record the whole window unsampled (torch.profiler with activities=[CPU, CUDA], no trace sampling "
                 "or filtering; nsys profile -t cuda,nvtx)")


def gaps(store: Store, run_id: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the trace lacks (T010's signals): the counts, and `missing`, one short line per
    thing missing with how to record it (empty: nothing missing that these signals see)."""
    if params is None:  # T010's thresholds, at their defaults (the idle rules read them so)
        from . import get_rule

        params = get_rule("T010").params()
    p = params
    row = run_cache.memo_for(store.run_cache, run_id, "trace_gaps", lambda: store.sql(GAPS_SQL, {"run_id": run_id}).fetchone())
    gpu_ops, launched, after, unlaunched, ops, jumps, skipped, cpu_ops = (int(x or 0) for x in row)
    ops = ops if ops > 1 else 0  # one id: no steps to judge
    facts: dict[str, Any] = {
        "gpu_ops": gpu_ops, "launched_ops": launched, "ops_after_launched": after, "unlaunched_ops": unlaunched,
        "unlaunched_share": unlaunched / after if after else 0.0, "cpu_ops": cpu_ops, "op_ids": ops,
        "op_id_jump_share": jumps / (ops - 1) if ops > 1 else 0.0,
        "op_id_density": ops / (ops + skipped) if ops else 1.0, "signals": [], "missing": [],
    }
    if gpu_ops < p["min_gpu_ops_count"]:
        return facts  # no gap between operations to attribute
    if launched == 0:
        facts["signals"].append("no_launch_calls")
        facts["missing"].append(f"the launch call of every GPU operation ({gpu_ops}): record CUDA/HIP runtime API "
                                "events (torch.profiler activities=[CPU, CUDA]; nsys profile -t cuda) and keep them")
    elif unlaunched >= p["min_unlaunched_count"] and facts["unlaunched_share"] >= p["min_unlaunched_share"]:
        facts["signals"].append("launches_missing")
        facts["missing"].append(f"the launch calls of {unlaunched} of the {after} GPU operations after the first "
                                "launched one on their stream, and the host events around them: " + HOW_TO_RECORD)
    if (ops >= p["min_ops_count"] and facts["op_id_jump_share"] >= p["min_id_jump_share"]
            and facts["op_id_density"] <= p["max_id_density_share"]):
        facts["signals"].append("events_thinned")
        facts["missing"].append(f"the operators between the recorded ones and the GPU work they launched "
                                f"({_pct(1 - facts['op_id_density'])} of the operator ids between the first and last "
                                "recorded are absent): " + HOW_TO_RECORD)
    return facts


def unseen_waits(store: Store, run_id: str) -> list[dict]:
    """Per blocking call name: GPU-idle time after the work ending the stretch was issued while
    the host sat in that call (`ns`, `stretches`, the longest `worst_start_ns`..`worst_end_ns`)."""
    df = run_cache.memo_for(store.run_cache, run_id, "unseen_waits", lambda: store.sql(UNSEEN_SQL, {"run_id": run_id}).fetchall())
    return [{"call": n, "ns": int(ns), "stretches": int(k), "worst_start_ns": int(s), "worst_end_ns": int(e)}
            for n, ns, k, s, e in df]


def pretrace_held(store: Store, run_id: str) -> list[tuple[int | None, int, int]]:
    """The device-idle stretches (device_id, start_ns, end_ns) ended by work held by an event
    recorded before the trace began (PRETRACE_SQL): none where no stream waits on one."""
    def compute():
        if not store.sql(PRETRACE_WAITS_SQL, {"run_id": run_id}).fetchone()[0]:
            return []
        return [(d, int(s), int(e)) for d, s, e in store.sql(PRETRACE_SQL, {"run_id": run_id}).fetchall()]

    return run_cache.memo_for(store.run_cache, run_id, "pretrace_held", compute)


PRETRACE_MISSING = ("the GPU work behind the event a stream waited on, recorded before the trace began (work "
                    "launched before a trace runs in it unrecorded): start the trace a step earlier, so that the work "
                    "waited on is in it")
PRETRACE_NOTE = "; cause unknown: the work ending it waited on an event recorded before the trace began"
PRETRACE_REASON = ("most of its idle time ends where a stream waited on an event recorded before the trace began: "
                   "that time may be GPU work launched before the trace, not time measured lost")


def unseen_missing(waits: list[dict]) -> str:
    calls = ", ".join(w["call"] for w in waits[:3])
    return (f"the event, stream or driver work the blocking call ({calls}) and the issued work waited on while no "
            "GPU work ran: record all streams and processes on the GPU with CUDA/HIP API tracing (nsys profile -t "
            "cuda --cuda-event-trace=true, or torch.profiler in every process; rocprofv3 --hip-trace --kernel-trace)")


def _pct(x: float) -> str:
    return f"{100 * x:.2g}%" if 0 < x < 0.001 else f"{100 * x:.1f}%"


# T001 abstains on a dependency story when the host sat in blocking calls with no GPU busy
# for at least this share of the finding's dependency idle time.
UNSEEN_SHARE = 0.5
SAMPLED_NOTE = "; cause unknown: the trace is sampled or stripped (T010)"
# On a sampled trace the idle time itself is not measured: at most info, with this reason.
SAMPLED_REASON = "its idle stretches may hold GPU work the sampled trace dropped: not time measured lost"
UNSEEN_NOTE = "; cause unknown: what the issued work waited on is not in the trace"


def abstain(df: pd.DataFrame, missing_of, severity_reason: str = "") -> pd.DataFrame:
    """`df` (a rule's findings) with each finding for which `missing_of(row)` gives a non-empty
    (missing, note) saying `cause: unknown`: evidence `cause` and `missing`, the hint naming
    what is missing (`unknown_hint`), `note` added to the message; with `severity_reason` (or a
    third item of `missing_of`'s, the row's own), at most info for that reason (the diagnosis
    reads it: a finding's own cap)."""
    df = df.copy()
    for i, row in df.iterrows():
        missing, note, *own = missing_of(row)
        if not missing:
            continue
        reason = own[0] if own else severity_reason
        ev = row["evidence"]
        ev = json.loads(ev) if isinstance(ev, str) else dict(ev or {})
        ev["cause"], ev["missing"] = CAUSE_UNKNOWN, list(missing)
        if reason:
            ev["severity_reason"] = reason
            df.at[i, "severity"] = "info"
        df.at[i, "evidence"] = json.dumps(ev, sort_keys=True, default=str)
        df.at[i, "hint"] = unknown_hint(missing)
        df.at[i, "message"] = str(row["message"]) + note
    return df


def unknown_hint(missing: list[str]) -> str:
    """The hint of a finding that abstains: what the trace lacks, how to record it said once."""
    how = ": " + HOW_TO_RECORD
    lacks = [m.removesuffix(how) for m in missing]
    shared = sum(m.endswith(how) for m in missing) > 1
    return ("Cause unknown: the trace lacks " + "; and ".join(lacks if shared else missing)
            + (how if shared else "") + ".")


def idle_unknown(store: Store, run_id: str, df: pd.DataFrame) -> pd.DataFrame:
    """An idle-cause rule's findings (T003, T004, T006), or an overlap rule's (T002, T007), on a
    sampled or stripped run: every one abstains (the stretches it reads as idle, or as a copy or
    collective with nothing beside it, may hold work the trace dropped)."""
    missing = gaps(store, run_id)["missing"]
    return abstain(df, lambda row: (missing, SAMPLED_NOTE), SAMPLED_REASON) if missing else df


def launch_gap_unknown(store: Store, run_id: str, df: pd.DataFrame) -> pd.DataFrame:
    """T001's findings: all abstain on a sampled or stripped run; one whose main cause is a
    dependency (issued, waited) abstains where, for at least UNSEEN_SHARE of its dependency idle
    time, the device-idle stretches end with work held by an event recorded before the trace
    (`pretrace_held`: at most info, it may not be idle time), or else the host sat in blocking
    calls with no GPU busy (`unseen_waits`)."""
    missing = gaps(store, run_id)["missing"]
    if missing:
        return abstain(df, lambda row: (missing, SAMPLED_NOTE), SAMPLED_REASON)
    waits: list[dict] | None = None
    held = pretrace_held(store, run_id)

    def of(row):
        nonlocal waits
        ev = row["evidence"]
        ev = json.loads(ev) if isinstance(ev, str) else ev
        if ev.get("main_cause") not in ("dependency", "copy"):
            return [], ""
        idle = ev.get("cause_idle_ns") or ev.get("cause_ns") or {}
        dependency = idle.get("dependency", 0) + idle.get("copy", 0)
        device = None if row["device_id"] is None or row["device_id"] != row["device_id"] else int(row["device_id"])
        held_ns = sum(min(e, row["end_ns"]) - max(s, row["start_ns"]) for d, s, e in held
                      if d == device and s < row["end_ns"] and e > row["start_ns"])
        if dependency > 0 and held_ns >= UNSEEN_SHARE * dependency:
            return [PRETRACE_MISSING], PRETRACE_NOTE, PRETRACE_REASON
        if waits is None:
            waits = unseen_waits(store, run_id)
        unseen = sum(w["ns"] for w in waits)
        if dependency > 0 and unseen >= UNSEEN_SHARE * dependency:
            return [unseen_missing(waits)], UNSEEN_NOTE
        return [], ""

    return abstain(df, of)
