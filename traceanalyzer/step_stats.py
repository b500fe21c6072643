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
"""

from __future__ import annotations

from .ranges import normalized_sql
from .store import Store, views

STEP_KEY = "ProfilerStep#*"  # every ProfilerStep#N pooled under one name
WARMUP_FACTOR = 1.5
OUTLIER_FACTOR = 1.5

# The run's steps, each with its name pooled as in diff's range table.
STEPS_SQL = f"""
SELECT regexp_replace(name, '{views.PROFILER_STEP}', '{STEP_KEY}') AS step, start_ns, end_ns - start_ns AS ns
FROM steps WHERE run_id = $run_id ORDER BY start_ns, range_id
"""

# The ranges named $name (as stored or normalised), per side.
NAMED_SQL = f"""
SELECT CASE WHEN kind = 'gpu_user_annotation' THEN 'gpu' ELSE 'host' END AS side, $name AS step,
       start_ns, end_ns - start_ns AS ns
FROM ranges
WHERE run_id = $run_id AND kind <> 'nvtx_mark' AND end_ns >= start_ns
  AND (name = $name OR {normalized_sql(f"regexp_replace(name, '{views.PROFILER_STEP}', '{STEP_KEY}')")} = $name)
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
