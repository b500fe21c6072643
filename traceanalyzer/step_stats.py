"""A run's iterations and how long they took: the per-step time distribution.

Steps are the `steps` view's ranges (Kineto `ProfilerStep#N`, else NVTX or user ranges named
like a step), or the ranges of one name the user says mark a step (`--step-range NAME`:
matched on the name as stored or as normalised by `ranges.normalize_name`, on the host side
when the run has it there, else the GPU side). The distribution:

* warm-up steps: the leading steps each longer than WARMUP_FACTOR times the median of the
  steps after the first (the first iterations autotune, allocate and compile), at most half of
  the steps; they are set apart and left out of everything below;
* `median_ns`, `p90_ns` (linear interpolation between the closest ranks), `mean_ns`, `min_ns`,
  `max_ns` of the others;
* outliers: steps (warm-up excluded) more than OUTLIER_FACTOR times the median, or less than
  the median over OUTLIER_FACTOR.

The budget per step (`step_budget`): per device, each part of the time budget (compute,
communication, copy, memset, idle by cause) averaged over the steady steps, from the store's
`run_step_budget` (each step's window inside the device's span). Host operator time per step
(`host_operator_ns`): the PyTorch operators not inside another operator of their thread, summed.
"""

from __future__ import annotations

from .analyses.steps import PROFILER_STEP
from .store import Store, views

STEP_KEY = "ProfilerStep#*"  # every ProfilerStep#N pooled under one name
WARMUP_FACTOR = 1.5
OUTLIER_FACTOR = 1.5

# The run's steps, each with its name pooled as in diff's range table.
STEPS_SQL = f"""
SELECT regexp_replace(name, '{PROFILER_STEP}', '{STEP_KEY}') AS step, start_ns, end_ns - start_ns AS ns
FROM steps WHERE run_id = $run_id ORDER BY start_ns, range_id
"""

# The ranges named $name (as stored or normalised), per side.
NAMED_SQL = f"""
SELECT CASE WHEN kind = 'gpu_user_annotation' THEN 'gpu' ELSE 'host' END AS side, $name AS step,
       start_ns, end_ns - start_ns AS ns
FROM ranges
WHERE run_id = $run_id AND kind <> 'nvtx_mark' AND end_ns >= start_ns
  AND (name = $name OR normalized_name(regexp_replace(name, '{PROFILER_STEP}', '{STEP_KEY}')) = $name)
ORDER BY start_ns, range_id
"""


def step_rows(store: Store, run_id: str, name: str | None = None) -> list[dict]:
    """The run's steps in time order as {"step", "start_ns", "ns"}: the `steps` view's of its
    most frequent (pooled) name, or the ranges named `name` (host side first)."""
    if name is None:
        rows = store.arrow(STEPS_SQL, {"run_id": run_id}).to_pylist()
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["step"]] = counts.get(r["step"], 0) + 1
        if not counts:
            return []
        top = max(counts, key=lambda k: (counts[k], k))
        return [r for r in rows if r["step"] == top]
    rows = store.arrow(NAMED_SQL, {"run_id": run_id, "name": name}).to_pylist()
    side = "host" if any(r["side"] == "host" for r in rows) else "gpu"
    return [{"step": r["step"], "start_ns": r["start_ns"], "ns": r["ns"], "side": side}
            for r in rows if r["side"] == side]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, interpolated linearly between closest ranks."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def distribution(rows: list[dict]) -> dict | None:
    """The per-step time distribution of `rows` (see the module docstring); None without steps."""
    if not rows:
        return None
    ns = [r["ns"] for r in rows]
    warmup = 0
    if len(ns) >= 3:
        later = percentile(ns[1:], 50)
        while warmup < len(ns) // 2 and ns[warmup] > WARMUP_FACTOR * later:
            warmup += 1
    steady = ns[warmup:]
    median = percentile(steady, 50)
    outliers = [{"index": i, "ns": d} for i, d in enumerate(ns) if i >= warmup
                and (d > OUTLIER_FACTOR * median or d * OUTLIER_FACTOR < median)]
    return {"step": rows[0]["step"], "steps": len(ns), "warmup_steps": warmup,
            "warmup_ns": [int(d) for d in ns[:warmup]], "median_ns": median, "p90_ns": percentile(steady, 90),
            "mean_ns": sum(steady) / len(steady), "min_ns": min(steady), "max_ns": max(steady),
            "total_ns": sum(ns), "outliers": outliers}


def run_steps(store: Store, run_id: str, name: str | None = None) -> dict | None:
    """`distribution` of the run's steps (`step_rows`)."""
    return distribution(step_rows(store, run_id, name))


# Each step's budget parts, the step's name pooled as in `STEPS_SQL`.
STEP_BUDGET_SQL = f"""
SELECT step_start_ns, device_id, category, cause, ns
FROM run_step_budget($run_id)
WHERE regexp_replace(step, '{PROFILER_STEP}', '{STEP_KEY}') = $step
"""


def step_budget(store: Store, run_id: str) -> list[dict]:
    """Per device and budget part (category, idle cause): `per_step_ns`, its mean over the steady
    steps of the `steps` view (steps with no time on a device count as 0 there)."""
    rows = step_rows(store, run_id)
    dist = distribution(rows)
    if dist is None:
        return []
    steady = {r["start_ns"] for r in rows[dist["warmup_steps"]:]}
    totals: dict[tuple, int] = {}
    views.install_on_demand(store.con)
    for r in store.arrow(STEP_BUDGET_SQL, {"run_id": run_id, "step": dist["step"]}).to_pylist():
        if r["step_start_ns"] in steady:
            key = (r["device_id"], r["category"], r["cause"])
            totals[key] = totals.get(key, 0) + r["ns"]
    return [{"device_id": d, "category": c, "cause": k, "per_step_ns": ns / len(steady)}
            for (d, c, k), ns in sorted(totals.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or ""))]


# Host time in PyTorch operators: those not inside another operator of the same thread (an
# operator starting before the latest end of the earlier ones is nested in one of them),
# starting inside the windows [$lo[i], $hi[i]).
HOST_OPERATORS_SQL = """
WITH w AS (SELECT unnest($lo) AS lo, unnest($hi) AS hi),
ops AS (
    SELECT start_ns, end_ns,
           max(end_ns) OVER (PARTITION BY pid, tid ORDER BY start_ns, end_ns DESC, op_id
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS open_until
    FROM cpu_ops WHERE run_id = $run_id AND end_ns >= start_ns)
SELECT count(*), coalesce(sum(end_ns - start_ns), 0)
FROM ops JOIN w ON ops.start_ns >= w.lo AND ops.start_ns < w.hi
WHERE open_until IS NULL OR start_ns >= open_until
"""


def host_operator_ns(store: Store, run_id: str) -> float | None:
    """Top-level PyTorch operator time per steady step (operators starting inside those steps);
    None when the run has no steps or no operators in them."""
    rows = step_rows(store, run_id)
    dist = distribution(rows)
    if dist is None:
        return None
    steady = rows[dist["warmup_steps"]:]
    count, total = store.sql(HOST_OPERATORS_SQL, {
        "run_id": run_id, "lo": [r["start_ns"] for r in steady],
        "hi": [r["start_ns"] + r["ns"] for r in steady]}).fetchone()
    return total / len(steady) if count else None
