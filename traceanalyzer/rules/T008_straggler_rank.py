"""T008 straggler rank: in a multi-rank job, the rank the others wait for."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

import msgspec

from ..fmt import ns, pct
from ..analyses.budget import COMM_PATTERN
from .base import Rule, Threshold
from .evidence import Evidence, doc

if TYPE_CHECKING:  # pandas is imported where used: loading the rules stays cheap (engine.run_rules)
    import pandas as pd

# Per run: the step ranges (ProfilerStep#N), and per step the collective and compute kernel
# time of the kernels launched in it (a kernel belongs to the step its launch call ran in;
# kernels without a launch call, to the step they start in). Kernel time is the union of
# intervals per device, so concurrent streams are not counted twice.
SQL = r"""
WITH runs_in AS (
    SELECT run_id, file_name, rank, world_size, clock, start_ns, end_ns FROM runs
    WHERE list_contains($run_ids, run_id)
), steps AS (
    SELECT run_id, name AS step, start_ns, end_ns FROM ranges
    WHERE list_contains($run_ids, run_id) AND kind IN ('user_annotation', 'nvtx')
      AND name LIKE 'ProfilerStep#%' AND end_ns > start_ns
), k AS (
    SELECT k.run_id, k.device_id, k.start_ns, k.end_ns, coalesce(a.start_ns, k.start_ns) AS launched_ns,
           regexp_matches(k.name, '__COMM__') AS is_comm
    FROM kernels k LEFT JOIN api_calls a ON a.run_id = k.run_id AND a.call_id = k.launch_call_id
    WHERE list_contains($run_ids, k.run_id) AND k.start_ns IS NOT NULL AND k.end_ns > k.start_ns
), k_step AS (  -- step NULL: launched outside every step range
    SELECT k.*, CASE WHEN k.launched_ns <= s.end_ns THEN s.step END AS step
    FROM k ASOF LEFT JOIN steps s ON s.run_id = k.run_id AND s.start_ns <= k.launched_ns
), islands AS (
    SELECT run_id, step, device_id, is_comm, isl, min(start_ns) AS start_ns, max(end_ns) AS end_ns FROM (
        SELECT *, sum(CASE WHEN prev_end IS NULL OR start_ns > prev_end THEN 1 ELSE 0 END)
                  OVER (PARTITION BY run_id, step, device_id, is_comm ORDER BY start_ns, end_ns
                        ROWS UNBOUNDED PRECEDING) AS isl
        FROM (SELECT run_id, step, device_id, is_comm, start_ns, end_ns,
                     max(end_ns) OVER (PARTITION BY run_id, step, device_id, is_comm ORDER BY start_ns, end_ns
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
              FROM k_step))
    GROUP BY ALL
)
SELECT r.run_id, r.file_name, r.rank, r.world_size, r.clock, r.start_ns AS run_start_ns, r.end_ns AS run_end_ns,
       i.step, s.start_ns AS step_start_ns, s.end_ns AS step_end_ns,
       coalesce(sum(i.end_ns - i.start_ns) FILTER (WHERE i.is_comm), 0) AS comm_ns,
       coalesce(sum(i.end_ns - i.start_ns) FILTER (WHERE NOT i.is_comm), 0) AS compute_ns,
       min(i.start_ns) AS gpu_start_ns, max(i.end_ns) AS gpu_end_ns
FROM runs_in r LEFT JOIN islands i USING (run_id) LEFT JOIN steps s ON s.run_id = i.run_id AND s.step = i.step
GROUP BY ALL
ORDER BY r.rank, r.run_id, s.start_ns
""".replace("__COMM__", COMM_PATTERN)


def _jobs(runs: pd.DataFrame) -> list[pd.DataFrame]:
    """Runs of one job: the same world size and, on a wall clock, overlapping in time (ranks of
    one job are captured together); on per-capture clocks, the same file name up to digits."""
    jobs = []
    for (_, wall), part in runs.groupby(["world_size", runs["clock"] == "unix-epoch"], sort=True):
        if wall:
            part = part.sort_values(["run_start_ns", "run_id"])
            cluster, reach = [], None
            for r in part.itertuples():
                if cluster and r.run_start_ns > reach:
                    jobs.append(part.loc[cluster])
                    cluster, reach = [], None
                cluster.append(r.Index)
                reach = r.run_end_ns if reach is None else max(reach, r.run_end_ns)
            jobs.append(part.loc[cluster])
        else:
            key = part["file_name"].map(lambda n: re.sub(r"\d+", "#", n))
            jobs += [g for _, g in part.groupby(key, sort=True)]
    return [j for j in jobs if j["rank"].nunique() >= 2]


def _per_rank(rows: pd.DataFrame, job: pd.DataFrame) -> pd.DataFrame:
    """One row per run of the job: steps common to all its runs, and per-step averages."""
    import pandas as pd

    mine = rows[rows["run_id"].isin(job["run_id"])]
    stepped = mine[mine["step"].notna()]
    common = set.intersection(*[set(g["step"]) for _, g in stepped.groupby("run_id")]) if (
        stepped["run_id"].nunique() == len(job)) else set()
    out = []
    for run_id, g in mine.groupby("run_id", sort=False):
        g = g[g["step"].isin(common)] if common else g  # without common steps: the whole run
        first = g.iloc[0]
        n_steps = len(common) if common else 1
        if common:
            step_ns = float((g["step_end_ns"] - g["step_start_ns"]).mean())
        else:
            step_ns = float(g["gpu_end_ns"].max() - g["gpu_start_ns"].min()) if g["gpu_start_ns"].notna().any() else None
        out.append({"run_id": run_id, "file_name": first["file_name"], "rank": int(first["rank"]),
                    "steps": n_steps, "stepped": bool(common), "step_ns": step_ns,
                    "comm_ns": float(g["comm_ns"].sum()) / n_steps, "compute_ns": float(g["compute_ns"].sum()) / n_steps,
                    "first_ns": _int(g["step_start_ns"].min() if common else g["gpu_start_ns"].min()),
                    "last_ns": _int(g["step_end_ns"].max() if common else g["gpu_end_ns"].max())})
    return pd.DataFrame(out).sort_values(["rank", "run_id"]).reset_index(drop=True)


def _int(x):
    return None if x is None or x != x else int(x)


# The runs given, as `_jobs` groups them: the kernels are read only for runs of a job of two
# ranks or more (a single run, or unrelated ones, cost one look at the runs table).
RUNS_SQL = """
SELECT run_id, file_name, rank, world_size, clock, start_ns AS run_start_ns, end_ns AS run_end_ns FROM runs
WHERE list_contains($run_ids, run_id) ORDER BY rank, run_id
"""


def _given_jobs(store, run_ids: list[str]) -> list[pd.DataFrame]:
    return _jobs(store.sql(RUNS_SQL, {"run_ids": list(run_ids)}).df())


def groups(store, run_ids: list[str]) -> list[list[str]]:
    """The jobs among `run_ids`, as lists of their runs."""
    return [list(job["run_id"]) for job in _given_jobs(store, run_ids)]


def evaluate(store, run_ids: list[str], p: dict) -> pd.DataFrame:
    import pandas as pd

    jobs = _given_jobs(store, run_ids)
    if not jobs:
        return pd.DataFrame()
    rows = store.sql(SQL, {"run_ids": [r for job in jobs for r in job["run_id"]]}).df()
    findings = []
    for job in jobs:
        ranks = _per_rank(rows, job)
        by_comm = bool((ranks["comm_ns"] > 0).all())
        if by_comm:  # the others wait in collectives for the rank that arrives last
            straggler = ranks.loc[ranks["comm_ns"].idxmin()]
            lag = float(ranks["comm_ns"].median() - straggler["comm_ns"])
            signal = "least time in collectives"
        else:
            straggler = ranks.loc[ranks["compute_ns"].idxmax()]
            lag = float(straggler["compute_ns"] - ranks["compute_ns"].median())
            signal = "most compute time"
        step_median = float(ranks["step_ns"].median()) if ranks["step_ns"].notna().any() else None
        share = lag / step_median if step_median else None
        # No lag, no straggler: balanced ranks stay quiet at thresholds of 0 too.
        if share is None or not lag > 0 or lag < p["min_lag_ns"] or share < p["min_lag_share"]:
            continue
        compute_excess = float(straggler["compute_ns"] - ranks["compute_ns"].median())
        unit = "per step" if straggler["stepped"] else "over the run"
        findings.append({
            "run_id": straggler["run_id"], "item_kind": "run", "item_name": f"rank {int(straggler['rank'])}",
            "start_ns": straggler["first_ns"], "end_ns": straggler["last_ns"],
            "value": share, "value_unit": "share", "threshold": p["min_lag_share"],
            "est_loss_ns": int(round(lag * int(straggler["steps"]))),
            "severity": "error" if share >= p["error_share"] else None,
            "message": f"rank {int(straggler['rank'])} of {len(ranks)} traced (world size {int(job['world_size'].iloc[0])}) "
                       f"is the straggler: it has the {signal}, "
                       + (f"{ns(lag)} {unit} less than the median rank in collectives, which the others spend waiting"
                          if by_comm else f"{ns(lag)} {unit} more than the median rank")
                       + f" ({pct(share)} of the median step time {ns(step_median)}); its compute is "
                       f"{ns(compute_excess)} {unit} above the median",
            "hint": "Balance work across ranks: look at what this rank computes that the others do not (uneven "
                    "data or sequence lengths, extra logging/checkpointing/evaluation on one rank, a slower GPU "
                    "or host), and at its host timeline (T004) for data loading stalls.",
            "evidence": {"straggler_rank": int(straggler["rank"]), "signal": "collectives" if by_comm else "compute",
                         "lag_ns": lag, "median_step_ns": step_median, "compute_excess_ns": compute_excess,
                         "steps": int(straggler["steps"]),
                         "ranks": [{"rank": int(r.rank), "file": r.file_name, "steps": int(r.steps),
                                    "step_ns": r.step_ns, "comm_ns": r.comm_ns, "compute_ns": r.compute_ns}
                                   for r in ranks.itertuples()]},
        })
    return pd.DataFrame(findings)


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T008Rank(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    comm_ns: Annotated[float, doc("communication time per step")]
    compute_ns: Annotated[float, doc("compute time per step")]
    file: Annotated[str, doc("the rank's trace file")]
    rank: Annotated[int, doc("the rank")]
    step_ns: Annotated[float, doc("step time")]
    steps: Annotated[int, doc("steps counted")]


class T008Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    compute_excess_ns: Annotated[float, doc("how much longer the straggler computes per step than the median rank")]
    lag_ns: Annotated[float, doc("how much later the straggler reaches each step's collectives")]
    median_step_ns: Annotated[float, doc("median step time over ranks")]
    ranks: Annotated[list[T008Rank], doc("per rank: step, compute and communication time")]
    signal: Annotated[str, doc("what marks the straggler (compute or late arrival)")]
    steps: Annotated[int, doc("the steps every rank of the job has (1: without those, the whole run)")]
    straggler_rank: Annotated[int, doc("the slow rank")]


RULE = Rule(
    id="T008",
    evidence=T008Evidence,
    name="straggler-rank",
    title="Straggler rank in a multi-rank job",
    phase="timeline",
    severity="warning",
    what="Across the traces of one multi-rank job checked together, the rank the others wait for: per "
         "rank, the step time, the collective (NCCL) kernel time and the compute kernel time per step, "
         "the straggler, and by how much it lags the median rank.",
    why="Collectives finish only when the last rank arrives, so every rank runs at the speed of the "
        "slowest: the others spend the difference inside their collective kernels, waiting. Finding "
        "the straggler points at the imbalance (uneven data, extra work on one rank, a slow device "
        "or host) instead of at communication.",
    how="Runs form a job when they carry a distributed rank and the same world size (Kineto "
        "`distributedInfo`) and, on a wall clock, overlap in time (else: the same file name up to "
        "digits); a job needs two ranks or more. Per run, kernels are assigned to the "
        "`ProfilerStep#N` range their launch call ran in, keeping only steps every rank of the job "
        "has (without steps, the whole run is one step); collective kernels (the T007 name pattern) "
        "and the others (compute) are merged into disjoint intervals per device and summed per step. "
        "The straggler is the rank with the least collective time per step (the others wait for it), "
        "or without collectives the one with the most compute per step; its lag is the median rank's "
        "collective time minus its own (or its compute minus the median's). Reported when the lag "
        "is at least `min_lag_ns` and `min_lag_share` of the median step time (CPU step range; "
        "without steps, the GPU active span), an error from `error_share`. The estimated loss is the "
        "lag times the steps: the time the median rank waits for the straggler.",
    fix="Balance the work per rank (shard data evenly, pad or bucket sequence lengths, move logging "
        "and evaluation off the critical rank) and check the straggler's own host and device.",
    requires="traces of two or more ranks of one job (Kineto distributedInfo rank and world size) with timed kernels",
    applies_sql="SELECT (SELECT rank IS NOT NULL AND world_size > 1 FROM runs WHERE run_id = $run_id) AND "
                "EXISTS (SELECT 1 FROM kernels WHERE run_id = $run_id AND start_ns IS NOT NULL)",
    thresholds=(
        Threshold("min_lag_ns", 100000, "The straggler's lag per step must be at least this (100 us)..."),
        Threshold("min_lag_share", 0.05, "...and this share of the median step time."),
        Threshold("error_share", 0.2, "Lag share that makes an error."),
    ),
    evaluate=evaluate,
    scope="runs",
    groups=groups,
    references=(
        "Nsight Systems recipe nccl_straggler",
        "Holistic Trace Analysis: temporal breakdown and straggler analysis across ranks",
    ),
)
