"""A run as a Chrome / Perfetto trace (JSON trace-event format), findings included.

GPU work goes to one process per device ("GPU 0: <name>") with a thread per stream, like
Kineto writes it; host API calls, framework operators and NVTX ranges stay on their
real process and thread, with a flow arrow from each launch call to its kernel or copy.
Each finding is an instant marker on the track it is about (its stream; a device-level
finding on the device's "findings" thread; a run-level one in a "traceanalyzer findings"
process) with its message, hint and evidence as arguments, plus an async slice over its
time range and one per example range of its evidence, so Perfetto UI or chrome://tracing
can search for a rule id and jump to each problem.

Events are written by DuckDB (`to_json` of a struct per row), so a run with millions of
events streams out without a Python loop over them. Times: `ts`/`dur` in microseconds
from the run's first event (ns precision kept as fractions).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO, Iterator

import msgspec

from .. import __version__
from ..rules import all_rules
from ..store import Store
from .html_timeline import _item_streams, examples

GPU_PID_BASE = 10_000_000  # above any Linux pid (pid_max <= 2^22)
FINDINGS_PID = GPU_PID_BASE - 1
FINDINGS_TID = 2_000_000_000
FINDING_CAT = "traceanalyzer.finding"


class ExportError(Exception):
    """A run that cannot be exported (one line)."""


def _gpu_pid(col: str) -> str:
    return f"({GPU_PID_BASE} + coalesce({col}, 999))"


def _ts(col: str) -> str:
    return f"round(({col} - $t0) / 1000.0, 3)"


# One query per kind of event; each returns a single JSON text column `ev`.
EVENT_SQL: dict[str, str] = {
    "kernels": f"""
        SELECT to_json({{'name': coalesce(name, '?'), 'cat': 'kernel', 'ph': 'X', 'pid': {_gpu_pid('device_id')},
            'tid': coalesce(stream_id, 0), 'ts': {_ts('start_ns')}, 'dur': round((end_ns - start_ns) / 1000.0, 3),
            'args': {{'kernel_id': kernel_id, 'grid': [grid_x, grid_y, grid_z], 'block': [block_x, block_y, block_z],
                      'registers_per_thread': registers_per_thread,
                      'shared_mem_bytes': coalesce(static_shared_mem_bytes, 0) + coalesce(dynamic_shared_mem_bytes, 0),
                      'correlation_id': correlation_id, 'graph_id': graph_id}}}}) AS ev
        FROM kernels WHERE run_id = $run_id AND start_ns IS NOT NULL AND end_ns >= start_ns""",
    "copies": f"""
        SELECT to_json({{'name': 'Memcpy ' || coalesce(direction, 'unknown') || CASE WHEN unified_memory THEN ' (unified)' ELSE '' END,
            'cat': 'memcpy', 'ph': 'X', 'pid': {_gpu_pid('device_id')}, 'tid': coalesce(stream_id, 0),
            'ts': {_ts('start_ns')}, 'dur': round((end_ns - start_ns) / 1000.0, 3),
            'args': {{'copy_id': copy_id, 'bytes': bytes, 'src_kind': src_kind, 'dst_kind': dst_kind,
                      'api_name': api_name, 'correlation_id': correlation_id}}}}) AS ev
        FROM copies WHERE run_id = $run_id AND start_ns IS NOT NULL AND end_ns >= start_ns""",
    "memsets": f"""
        SELECT to_json({{'name': 'Memset', 'cat': 'memset', 'ph': 'X', 'pid': {_gpu_pid('device_id')},
            'tid': coalesce(stream_id, 0), 'ts': {_ts('start_ns')}, 'dur': round((end_ns - start_ns) / 1000.0, 3),
            'args': {{'memset_id': memset_id, 'bytes': bytes, 'correlation_id': correlation_id}}}}) AS ev
        FROM memsets WHERE run_id = $run_id AND start_ns IS NOT NULL AND end_ns >= start_ns""",
    "gpu_ranges": f"""
        SELECT to_json({{'name': coalesce(name, '?'), 'cat': kind, 'ph': 'X', 'pid': {_gpu_pid('device_id')},
            'tid': coalesce(stream_id, 0), 'ts': {_ts('start_ns')}, 'dur': round((end_ns - start_ns) / 1000.0, 3),
            'args': {{'range_id': range_id}}}}) AS ev
        FROM ranges WHERE run_id = $run_id AND device_id IS NOT NULL AND start_ns IS NOT NULL AND end_ns >= start_ns""",
}

HOST_SQL: dict[str, str] = {
    "api_calls": f"""
        SELECT to_json({{'name': coalesce(name, raw_name, '?'), 'cat': 'cuda_' || coalesce(api, 'api'), 'ph': 'X',
            'pid': coalesce(pid, 0), 'tid': coalesce(tid, 0), 'ts': {_ts('start_ns')},
            'dur': round((end_ns - start_ns) / 1000.0, 3),
            'args': {{'call_id': call_id, 'correlation_id': correlation_id, 'return_value': return_value}}}}) AS ev
        FROM api_calls WHERE run_id = $run_id AND start_ns IS NOT NULL AND end_ns >= start_ns""",
    "cpu_ops": f"""
        SELECT to_json({{'name': coalesce(name, '?'), 'cat': 'cpu_op', 'ph': 'X', 'pid': coalesce(pid, 0),
            'tid': coalesce(tid, 0), 'ts': {_ts('start_ns')}, 'dur': round((end_ns - start_ns) / 1000.0, 3),
            'args': {{'op_id': op_id, 'input_dims': input_dims, 'external_id': external_id}}}}) AS ev
        FROM cpu_ops WHERE run_id = $run_id AND start_ns IS NOT NULL AND end_ns >= start_ns""",
    "host_ranges": f"""
        SELECT CASE WHEN end_ns > start_ns OR kind <> 'nvtx_mark' THEN
            to_json({{'name': coalesce(name, '?'), 'cat': kind, 'ph': 'X', 'pid': coalesce(pid, 0),
                      'tid': coalesce(tid, 0), 'ts': {_ts('start_ns')}, 'dur': round((end_ns - start_ns) / 1000.0, 3),
                      'args': {{'range_id': range_id, 'domain': domain}}}})
          ELSE to_json({{'name': coalesce(name, '?'), 'cat': kind, 'ph': 'i', 's': 't', 'pid': coalesce(pid, 0),
                         'tid': coalesce(tid, 0), 'ts': {_ts('start_ns')}, 'args': {{'range_id': range_id, 'domain': domain}}}})
          END AS ev
        FROM ranges WHERE run_id = $run_id AND device_id IS NULL AND start_ns IS NOT NULL AND end_ns >= start_ns""",
    # From each launch call to the GPU work it launched (flow events bind to the enclosing slices).
    "flows": f"""
        WITH l AS (
            SELECT g.device_id, g.stream_id, g.start_ns AS gpu_ns, a.pid, a.tid, a.start_ns AS call_ns,
                   row_number() OVER (ORDER BY g.start_ns, g.kind, g.item_id) AS n
            FROM gpu_activity g JOIN api_calls a ON a.run_id = g.run_id AND a.call_id = g.launch_call_id
            WHERE g.run_id = $run_id AND a.start_ns IS NOT NULL
        )
        SELECT to_json({{'name': 'launch', 'cat': 'launch', 'ph': 's', 'id': n, 'pid': coalesce(pid, 0),
                        'tid': coalesce(tid, 0), 'ts': {_ts('call_ns')}}}) FROM l
        UNION ALL
        SELECT to_json({{'name': 'launch', 'cat': 'launch', 'ph': 'f', 'bp': 'e', 'id': n, 'pid': {_gpu_pid('device_id')},
                        'tid': coalesce(stream_id, 0), 'ts': {_ts('gpu_ns')}}}) FROM l""",
    # The allocator's total when recorded, else the running sum of allocations and frees.
    "memory": f"""
        WITH ev AS (
            SELECT *, count(*) FILTER (WHERE total_allocated_bytes IS NULL)
                          OVER (PARTITION BY device_type, device_id) = 0 AS recorded
            FROM memory_events WHERE run_id = $run_id AND ts_ns IS NOT NULL
        ), c AS (
            SELECT *, CASE WHEN recorded THEN total_allocated_bytes
                           ELSE sum(coalesce(bytes, 0)) OVER (PARTITION BY device_type, device_id
                                                              ORDER BY ts_ns, event_id ROWS UNBOUNDED PRECEDING) END AS alloc
            FROM ev
        )
        SELECT to_json({{'name': CASE WHEN recorded THEN 'memory allocated' ELSE 'memory allocated (net, since trace start)' END,
            'cat': 'memory', 'ph': 'C',
            'pid': CASE WHEN device_type = 'cuda' AND device_id >= 0 THEN {_gpu_pid('device_id')} ELSE coalesce(pid, 0) END,
            'ts': {_ts('ts_ns')}, 'args': {{'bytes': alloc}}}}) FROM c""",
}


def _meta(store: Store, run_id: str, host: bool) -> Iterator[dict]:
    names = dict(store.sql("SELECT device_id, name FROM devices WHERE run_id = ?", [run_id]).fetchall())
    tracks = store.sql("""SELECT DISTINCT device_id, stream_id FROM gpu_activity WHERE run_id = ?
                          UNION SELECT DISTINCT device_id, stream_id FROM ranges WHERE run_id = ? AND device_id IS NOT NULL
                          ORDER BY 1 NULLS LAST, 2 NULLS LAST""", [run_id, run_id]).fetchall()
    for dev in dict.fromkeys(d for d, _ in tracks):
        pid = GPU_PID_BASE + (999 if dev is None else dev)
        label = f"GPU {'?' if dev is None else dev}" + (f": {names[dev]}" if names.get(dev) else "")
        yield {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}}
        yield {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": -100 + (dev or 0)}}
        yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": FINDINGS_TID, "args": {"name": "findings (traceanalyzer)"}}
        yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": FINDINGS_TID, "args": {"sort_index": -1}}
    for dev, stream in tracks:
        pid = GPU_PID_BASE + (999 if dev is None else dev)
        yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": stream or 0,
               "args": {"name": f"stream {'?' if stream is None else stream}"}}
    yield {"name": "process_name", "ph": "M", "pid": FINDINGS_PID, "args": {"name": "traceanalyzer findings"}}
    yield {"name": "process_sort_index", "ph": "M", "pid": FINDINGS_PID, "args": {"sort_index": -1000}}
    if host:
        for (pid,) in store.sql("""SELECT DISTINCT coalesce(pid, 0) FROM api_calls WHERE run_id = $r
                                   UNION SELECT DISTINCT coalesce(pid, 0) FROM cpu_ops WHERE run_id = $r
                                   UNION SELECT DISTINCT coalesce(pid, 0) FROM ranges WHERE run_id = $r AND device_id IS NULL
                                   ORDER BY 1""", {"r": run_id}).fetchall():
            yield {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"host process {pid}"}}


def finding_events(store: Store, run_id: str, findings: list[dict], t0: int) -> list[dict]:
    """Markers and slices for the findings of one run."""
    rules = {r.id: r for r in all_rules()}
    streams = _item_streams(store, run_id, findings)
    starts = dict(((k, i), s) for k, i, s in store.sql(
        "SELECT kind, item_id, start_ns FROM gpu_activity WHERE run_id = ? AND list_contains(?, kind || ':' || item_id)",
        [run_id, [f"{f['item_kind']}:{f['item_id']}" for f in findings if f.get("item_id") is not None]]).fetchall())
    out = []
    for n, f in enumerate(findings):
        rule = rules.get(f["rule_id"])
        name = f"{f['rule_id']} {rule.name if rule else ''} ({f['severity']})".replace("  ", " ")
        item = (f.get("item_kind"), None if f.get("item_id") is None else int(f["item_id"]))
        dev = f.get("device_id")
        stream = f.get("stream_id") if f.get("stream_id") is not None else streams.get(item)
        if dev is None:
            pid, tid = FINDINGS_PID, 0
        else:
            pid, tid = GPU_PID_BASE + dev, FINDINGS_TID if stream is None else stream
        start = f.get("start_ns") if f.get("start_ns") is not None else starts.get(item)
        at = t0 if start is None else start
        args = {k: f.get(k) for k in ("rule_id", "severity", "message", "hint", "est_loss_ns", "value", "value_unit",
                                      "threshold", "item_kind", "item_id", "item_name", "device_id", "stream_id",
                                      "fingerprint") if f.get(k) is not None}
        if rule:
            args["rule_title"] = rule.title
        if f.get("evidence") is not None:
            args["evidence"] = f["evidence"]
        if start is None:
            args["note"] = "the finding has no time range; placed at the start of the run"
        out.append({"name": name, "cat": FINDING_CAT, "ph": "i", "s": "t", "pid": pid, "tid": tid,
                    "ts": round((at - t0) / 1000, 3), "args": args})
        ranges = []
        if f.get("start_ns") is not None and f.get("end_ns") is not None and f["end_ns"] > f["start_ns"]:
            ranges.append((name, f["start_ns"], f["end_ns"], {"message": f["message"]}))
        for r in examples(f):
            if r.end_ns > r.start_ns and (r.start_ns, r.end_ns) != (f.get("start_ns"), f.get("end_ns")):
                ranges.append((f"{f['rule_id']} example", r.start_ns, r.end_ns,
                               {"finding": f["message"], **msgspec.to_builtins(r)}))
        for j, (rname, s, e, rargs) in enumerate(ranges):
            ident = f"{run_id}-{n}-{j}"
            out.append({"name": rname, "cat": FINDING_CAT, "ph": "b", "id": ident, "pid": pid,
                        "ts": round((s - t0) / 1000, 3), "args": rargs})
            out.append({"name": rname, "cat": FINDING_CAT, "ph": "e", "id": ident, "pid": pid,
                        "ts": round((e - t0) / 1000, 3)})
    return out


def write(store: Store, run_id: str, findings: list[dict], fp: IO[str], *, host: bool = True) -> dict[str, int]:
    """Write the run's trace to `fp`; returns counts of events by kind."""
    rows = store.sql("SELECT file_name, format, start_ns FROM runs WHERE run_id = ?", [run_id]).fetchall()
    if not rows:
        raise ExportError(f"no run {run_id!r} in the store")
    file_name, fmt_, t0 = rows[0]
    if t0 is None:
        raise ExportError(f"{file_name} has no timeline ({fmt_}: profiled launches have no start times); nothing to export")
    other = {"traceanalyzer_version": __version__, "run_id": run_id, "source_file": file_name, "format": fmt_,
             "origin_ns": int(t0), "note": "ts/dur in microseconds from origin_ns on the run's clock"}
    fp.write('{"displayTimeUnit":"ns","otherData":' + json.dumps(other) + ',"traceEvents":[\n')
    counts: dict[str, int] = {}
    first = True

    def emit(lines) -> int:
        nonlocal first
        n = 0
        for line in lines:
            fp.write(line if first else ",\n" + line)
            first = False
            n += 1
        return n

    counts["metadata"] = emit(json.dumps(e, ensure_ascii=False) for e in _meta(store, run_id, host))
    queries = dict(EVENT_SQL, **(HOST_SQL if host else {"memory": HOST_SQL["memory"]}))
    for kind, sql in queries.items():
        cur = store.sql(sql, {"run_id": run_id, "t0": t0})
        n = 0
        while batch := cur.fetchmany(50_000):
            n += emit(r[0] for r in batch)
        counts[kind] = n
    counts["findings"] = emit(json.dumps(e, ensure_ascii=False, default=str)
                              for e in finding_events(store, run_id, findings, t0))
    fp.write("\n]}\n")
    return counts


def export(store: Store, run_id: str, findings: list[dict], path: Path, *, host: bool = True) -> dict[str, int]:
    """Write to `path` (gzip-compressed when it ends in .gz), atomically: a failed export
    leaves no half-written file."""
    tmp = path.with_name(path.name + ".part")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(tmp, "wt", encoding="utf-8") as fp:
            counts = write(store, run_id, findings, fp, host=host)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return counts
