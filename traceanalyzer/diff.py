"""Did the optimization pay? Two stored runs side by side.

The three checks after any optimization:

* time per kernel, matched by name across the runs (with count changes, and kernels that
  appear or disappear);
* end-to-end time: the run's span, the per-step time distribution (the `steps` view: Kineto
  `ProfilerStep#N`, else NVTX or user ranges named like a step; `step_stats`), throughput for
  time-sliced captures, GPU busy time per device, and every named NVTX / user-annotation range
  (names normalised, `ProfilerStep#N` pooled as `ProfilerStep#*`); when both runs have steps,
  each device's time budget per step (compute, communication, copy, memset, idle by cause,
  mean over the steady steps) and the host time in top-level PyTorch operators per step;
* every PyTorch operator (names normalised): calls and host time, per step when both runs have
  steps;
* peak device memory per device, as `summary.memory` gives it (allocator events: M001's peak
  of the `memory_levels` view; a memory snapshot: the peak of its recorded history; a memory
  timeline: its peak, with what each category held then), and reserved memory where known;
  when both runs split the peak by category, the change of each category (did peak memory pay
  for the speed-up, and which part of it grew);

plus the findings that are new in TEST or fixed since BASE, and a verdict.

First, whether the runs are alike (`comparability`: GPU model and count, SM count, world size,
rank, capture window): `comparable` and the `reasons` they are not. The numbers of unlike runs
are shown as measured, but the verdict is INCONCLUSIVE (never better or worse), and the gate
fails on it unless told to judge them all the same. A GPU model a trace does not carry is no
reason, but the verdict line says the same hardware is assumed (`unknowns`).

Per-device tables (busy time, step budget, memory) and the findings match devices by role
(`comparability.roles`: the local GPU index), not by id: each row has `gpu` and each run's
`base_device_id` / `test_device_id`.

"End-to-end time" for the verdict and the gate is, in this order of preference:

* the median step time when both runs have steps (warm-up steps left out; `step_stats`): a
  step does not depend on how long the profiler happened to record;
* throughput when either run is a time-sliced capture (a fixed window says nothing by its
  length): launches per second of the kernels both runs have, higher is better;
* the span;
* (ncu, no timeline) the summed kernel time.

A median step time that changed by less than its standard error allows (`median_test_p`,
with MIN_STEPS steady steps or more in each run) is no change in the verdict: the steps of
one run spread too, and a median that moved within that spread says nothing. The gate
compares the numbers alone.

Kernels count only when launched inside the capture: a kernel with no launch call in the trace
that starts before the run's first API call was launched before the profiler started, and is
left out (its count is in `not_counted`). Range names are matched once normalised
(`ranges.normalize_name`: `op_id = N`, `seq = N`, addresses and per-instance numbers stripped).
GPU busy time is the union of GPU work within each device, per device, never summed across
devices. Runs of different formats compare as far as both carry the data; a metric one side
lacks is shown as missing, not as zero.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

import pandas as pd

from . import comparability, step_stats, summary
from .link import run_roles
from .rules import _ncu as ncu
from .analyses.steps import PROFILER_STEP
from .store import run_cache
from .store import Store

STEP_KEY = step_stats.STEP_KEY
DEFAULT_NOISE_PCT = 1.0  # changes smaller than this are "unchanged" in the verdict
SIGNIFICANCE = 0.05  # a step-time change whose `median_test_p` is this high or more is "unchanged"
MIN_STEPS = 5  # steady steps each run needs: fewer say too little of their spread
KERNEL_TIME = "kernel time (sum)"


class DiffError(Exception):
    pass


@dataclass
class Metric:
    name: str
    unit: str  # "ns", "bytes", "per_s" or "share"
    base: float | None
    test: float | None
    better: str = "lower"  # or "higher" (throughput)
    p_value: float | None = None  # of the median steps' difference (`median_test_p`), given enough steps

    @property
    def comparable(self) -> bool:
        return self.base is not None and self.test is not None

    @property
    def delta(self) -> float | None:
        return self.test - self.base if self.comparable else None

    @property
    def delta_pct(self) -> float | None:
        if not self.comparable or self.base == 0:
            return None
        return 100.0 * (self.test - self.base) / self.base

    @property
    def worse_pct(self) -> float | None:
        """How much worse TEST is, in percent (negative: better)."""
        pct = self.delta_pct
        return None if pct is None else (pct if self.better == "lower" else -pct)

    def to_dict(self) -> dict:
        out = {**asdict(self), "delta": self.delta, "delta_pct": self.delta_pct}
        if self.unit == "share":  # a change of a share is in percentage points
            out["delta_pp"] = None if self.delta is None else 100 * self.delta
        return out


@dataclass
class RunDiff:
    base: dict  # runs row (run_id, file_name, format, span_ns, ...)
    test: dict
    match_by: str  # "name" or "short"
    kernels: pd.DataFrame  # one row per matched kernel key
    ranges: pd.DataFrame  # one row per (side, range name)
    memory: pd.DataFrame  # one row per device: each run's peak allocated and peak reserved bytes
    memory_categories: pd.DataFrame  # one row per device and category, where both runs have categories
    metrics: list[Metric]  # end-to-end numbers
    end_to_end: Metric | None  # the one the verdict and the gate use
    peak_memory: Metric
    new_findings: list[dict] = field(default_factory=list)
    fixed_findings: list[dict] = field(default_factory=list)
    unchanged_findings: int = 0
    setups: dict = field(default_factory=dict)  # "base"/"test" -> comparability.setup
    reasons: list[str] = field(default_factory=list)  # why the runs are not alike
    unknowns: list[str] = field(default_factory=list)  # what they may differ in, unknown (comparability.unknowns)
    steps: dict = field(default_factory=dict)  # "base"/"test" -> step_stats.distribution or None
    busy: pd.DataFrame = field(default_factory=pd.DataFrame)  # per device: busy and idle share
    step_budget: pd.DataFrame = field(default_factory=pd.DataFrame)  # per device and part: mean per step
    operators: pd.DataFrame = field(default_factory=pd.DataFrame)  # per PyTorch operator (normalised name)
    not_counted: dict = field(default_factory=dict)  # "base"/"test" -> kernels launched before the capture

    @property
    def comparable(self) -> bool:
        return not self.reasons

    def verdict(self, noise_pct: float = DEFAULT_NOISE_PCT) -> tuple[str, str]:
        """(word, one line): IMPROVED, REGRESSED, MIXED, NO CHANGE or UNKNOWN; INCONCLUSIVE, with
        the reasons and the changes as measured, when the runs are not alike."""
        t = _direction(self.end_to_end, noise_pct)
        m = _direction(self.peak_memory, noise_pct)
        if not self.comparable:
            word = "INCONCLUSIVE"
        elif t is None:
            word = "UNKNOWN"
        elif t == 0 and (m or 0) == 0:
            word = "NO CHANGE"
        elif t <= 0 and (m or 0) <= 0:
            word = "IMPROVED"
        elif t >= 0 and (m or 0) >= 0:
            word = "REGRESSED"
        else:
            word = "MIXED"
        parts = [_describe(self.end_to_end, f"end-to-end ({self.end_to_end.name})") if self.end_to_end
                 else "end-to-end time: not in both runs"]
        if self.peak_memory.comparable:
            largest = self.largest_category_change()
            parts.append(_describe(self.peak_memory, "peak memory")
                         + (f", {_category_change(largest)}" if largest else ""))
        elif self.has_memory:
            parts.append("peak memory: not in both runs")
        kernel_total = next((x for x in self.metrics if x.name == KERNEL_TIME), None)
        per_launch = self.kernel_time_per_launch()
        if per_launch is not None:
            # a time-sliced window holds as much work as fits: its totals fall as the work slows
            parts.append(_describe(per_launch, "kernel time per launch (matched kernels)")
                         + self._slowest_per_launch())
        elif kernel_total is not None and kernel_total.comparable:
            parts.append(_describe(kernel_total, "kernel time"))
        moved = self.largest_step_change()
        if moved:
            parts.append(moved)
        parts.append(f"findings: {len(self.new_findings)} new, {len(self.fixed_findings)} fixed")
        if not self.comparable:
            return word, (f"{word}: the runs are not alike ({'; '.join(self.reasons)}); as measured: "
                          + "; ".join(parts))
        return word, f"{word}: " + "; ".join(parts + self.unknowns)

    def kernel_time_per_launch(self) -> Metric | None:
        """On time-sliced captures judged by launches per second: the matched kernels' mean time
        per launch (their totals over a fixed window say how much work fitted, not how fast it ran)."""
        if self.end_to_end is None or self.end_to_end.unit != "per_s" or self.kernels.empty:
            return None
        k = _matched(self.kernels)
        counts = (k["base_count"].sum(), k["test_count"].sum())
        if not all(counts):
            return None
        return Metric("kernel time per launch", "ns", float(k["base_total_ns"].sum()) / counts[0],
                      float(k["test_total_ns"].sum()) / counts[1])

    def _slowest_per_launch(self) -> str:
        """', most in K (385 us -> 544 us a launch)': the matched kernel whose longer launches add
        most time at the test run's launch count, when one does."""
        from . import fmt

        k = _matched(self.kernels)
        k = k[(k["base_count"] > 0) & (k["test_count"] > 0)]
        if k.empty:
            return ""
        base_mean, test_mean = k["base_total_ns"] / k["base_count"], k["test_total_ns"] / k["test_count"]
        added = (test_mean - base_mean) * k["test_count"]
        if not added.max() > 0:
            return ""
        i = added.idxmax()
        name = k.loc[i, "short_name"] if "short_name" in k and isinstance(k.loc[i, "short_name"], str) else k.loc[i, "name"]
        return f", most in {name} ({fmt.ns(base_mean[i])} -> {fmt.ns(test_mean[i])} a launch)"

    def largest_step_change(self) -> str | None:
        """Where a step's time moved most, from the per-step budget: 'per step, idle: host
        63.0 ms -> 43.5 ms' (the part of one GPU's budget whose mean per steady step changed
        most), or None without a per-step budget in both runs."""
        df = self.step_budget
        if df.empty or not df["delta_ns"].abs().max():
            return None
        from . import fmt

        r = df.loc[df["delta_ns"].abs().idxmax()]
        part = r["category"] + (f": {r['cause']}" if isinstance(r["cause"], str) and r["cause"] else "")
        gpus = df["gpu"].nunique()
        where = f" on GPU {r['gpu']}" if gpus > 1 else ""
        return (f"per step, most change in {part}{where} "
                f"{fmt.ns(r['base_per_step_ns'])} -> {fmt.ns(r['test_per_step_ns'])}")

    @property
    def has_memory(self) -> bool:
        """Whether either run has a memory peak (two runs without one say nothing about memory)."""
        return self.peak_memory.base is not None or self.peak_memory.test is not None

    def largest_category_change(self) -> dict | None:
        """The category row whose bytes at the peak changed most (either way), or None."""
        df = self.memory_categories
        if df.empty or not df["delta_bytes"].abs().max():
            return None
        return df.loc[df["delta_bytes"].abs().idxmax()].to_dict()

    def memory_line(self) -> str | None:
        """'peak memory +12.0% (activations +1.2 GB)': the change of the peak (max over devices)
        and of the category that changed most; None when neither run has memory data."""
        m = self.peak_memory
        if not self.has_memory:
            return None
        if not m.comparable:
            return "peak memory: not in both runs"
        from . import fmt

        change = "n/a" if m.delta_pct is None else f"{m.delta_pct:+.1f}%"
        largest = self.largest_category_change()
        detail = _category_change(largest) if largest else f"{fmt.nbytes(m.base)} -> {fmt.nbytes(m.test)}"
        return f"peak memory {change} ({detail})"

    def gate(self, pct: float, allow_different: bool = False) -> dict:
        """The gate at `pct` percent: `failures` (what regressed by more than `pct`), `notes` (what
        could not be judged), `inconclusive` (why the comparison cannot be judged at all: no
        end-to-end time in both runs, or runs not alike unless `allow_different`), `passed`
        (neither failures nor inconclusive reasons) and `judged` (no inconclusive reason; a
        comparison not judged lists no failures)."""
        failures, notes = self._gate_numbers(pct)
        inconclusive = []
        if self.end_to_end is None:
            inconclusive.append("no end-to-end time in both runs (no steps, span or kernel times)")
        if not self.comparable:
            if allow_different:
                notes.append("judged although the runs are not alike (--allow-different-hardware)")
            else:
                inconclusive.append(f"the runs are not alike ({'; '.join(self.reasons)}); "
                                    "--allow-different-hardware gates them all the same")
        if inconclusive:  # the numbers of a comparison that cannot be judged fail nothing on their own
            failures = []
        return {"pct": pct, "failures": failures, "notes": notes, "inconclusive": inconclusive,
                "passed": not failures and not inconclusive, "judged": not inconclusive}

    def _gate_numbers(self, pct: float) -> tuple[list[str], list[str]]:
        """(failures, notes): what regressed by more than `pct` percent, and what could not be judged."""
        failures, notes = [], []
        for m, what in ((self.end_to_end, "end-to-end time"), (self.peak_memory, "peak memory")):
            if m is None or not m.comparable:
                notes.append(f"{what} not gated: not in both runs")
            elif m.worse_pct is None:
                notes.append(f"{what} not gated: base is 0")
            elif m.worse_pct > pct:
                failures.append(f"{what} ({m.name}) {m.delta_pct:+.1f}% ({m.worse_pct:.1f}% worse) > {pct:g}%"
                                if m.better == "higher" else f"{what} ({m.name}) +{m.delta_pct:.1f}% > {pct:g}%")
        return failures, notes

    def to_dict(self, noise_pct: float = DEFAULT_NOISE_PCT) -> dict:
        """Everything as JSON-ready values (the gate is the caller's to add)."""
        word, line = self.verdict(noise_pct)
        return {
            "base": self.base, "test": self.test, "match_by": self.match_by,
            "comparable": self.comparable, "reasons": self.reasons, "unknowns": self.unknowns, "setup": self.setups,
            "steps": self.steps, "busy": _records(self.busy), "not_counted": self.not_counted,
            "step_budget": _records(self.step_budget), "operators": _records(self.operators),
            "end_to_end": self.end_to_end.to_dict() if self.end_to_end else None,
            "peak_memory": self.peak_memory.to_dict(),
            "metrics": [m.to_dict() for m in self.metrics],
            "kernels": _records(self.kernels), "ranges": _records(self.ranges), "memory": _records(self.memory),
            "memory_categories": _records(self.memory_categories), "memory_line": self.memory_line(),
            "findings": {"new": self.new_findings, "fixed": self.fixed_findings,
                         "unchanged": self.unchanged_findings},
            "verdict": word, "verdict_line": line,
        }


def _direction(m: Metric | None, noise_pct: float) -> int | None:
    if m is None or not m.comparable:
        return None
    if m.p_value is not None and m.p_value >= SIGNIFICANCE:
        return 0  # the two runs' steps are not told apart: within their step-to-step spread
    if m.worse_pct is None:
        return 0 if m.delta == 0 else (1 if (m.delta > 0) == (m.better == "lower") else -1)
    return 0 if abs(m.worse_pct) < noise_pct else (1 if m.worse_pct > 0 else -1)


def _describe(m: Metric, label: str) -> str:
    show = show_value(m.unit)
    pct = "n/a" if m.delta_pct is None else f"{m.delta_pct:+.1f}%"
    spread = (f", within the step-to-step spread (p = {m.p_value:.2f})"
              if m.p_value is not None and m.p_value >= SIGNIFICANCE else "")
    return f"{label} {show(m.base)} -> {show(m.test)} ({pct}{spread})"


def median_test_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided p-value that the medians of `a` and `b` (two runs' steady step times) are
    equal: their difference over its standard error, each median's 1.2533 * sigma / sqrt(n)
    (the sample median's large-sample error) with sigma estimated robustly as 1.4826 * MAD, so
    that a few stalled steps widen it little; at least the smallest p-value any test of the two
    groups' order can give, 2 / C(n_a + n_b, n_a) (every step of one run shorter than every step
    of the other: 6 steps against 6, 2 / 924), since a handful of steps says no more than that.
    None with fewer than MIN_STEPS steps in either."""
    if len(a) < MIN_STEPS or len(b) < MIN_STEPS:
        return None

    def median(v):
        return step_stats.percentile(v, 50)

    def se2(v):
        mad = median([abs(x - median(v)) for x in v])
        return (1.2533 * 1.4826 * mad) ** 2 / len(v)

    floor = 2 / math.comb(len(a) + len(b), len(a))
    delta = abs(median(a) - median(b))
    se = math.sqrt(se2(a) + se2(b))
    if se == 0:
        return 1.0 if delta == 0 else floor
    return max(math.erfc(delta / se / math.sqrt(2)), floor)


def show_value(unit: str):
    """The formatter of a metric's values: time, bytes, a rate per second or a share."""
    from . import fmt

    return {"ns": fmt.ns, "bytes": fmt.nbytes,
            "per_s": lambda v: "-" if fmt._missing(v) else f"{v:,.0f}/s",
            "share": lambda v: "-" if fmt._missing(v) else f"{100 * v:.1f}%"}[unit]


def show_delta(unit: str):
    """The formatter of a change of a metric's value, signed: a share's in percentage points
    ("+7.6 pp": 9.8% -> 17.4% is no 7.6% change)."""
    from . import fmt

    if unit == "share":
        show = lambda v: f"{100 * v:.1f} pp"  # noqa: E731
    else:
        show = show_value(unit)
    return lambda v: "-" if fmt._missing(v) else ("+" if v > 0 else "") + show(v)


# A memory category in a sentence ("activations +1.2 GB").
CATEGORY_WORDS = {"parameter": "parameters", "optimizer_state": "optimizer state", "input": "inputs",
                  "temporary": "temporaries", "activation": "activations", "gradient": "gradients",
                  "autograd_detail": "autograd detail", "unknown": "unknown"}


def _category_change(row: dict) -> str:
    from . import fmt

    delta = row["delta_bytes"]
    word = CATEGORY_WORDS.get(row["category"], str(row["category"]).replace("_", " "))
    return f"{word} {'+' if delta > 0 else '-'}{fmt.nbytes(abs(delta))}"


def _records(df: pd.DataFrame) -> list[dict]:
    rows = df.astype(object).where(df.notna(), None).to_dict(orient="records")
    return [{k: (int(v) if isinstance(v, float) and v.is_integer() and k.endswith(("_ns", "count", "_bytes"))
                 else v) for k, v in r.items()} for r in rows]


# -- the numbers of one run -------------------------------------------------------------

def _kernel_key(by: str) -> str:
    if by == "short":
        return "coalesce(k.short_name, k.name)"
    # Full (demangled) names, blind to white space, which tools write differently ("> >").
    return r"regexp_replace(coalesce(k.name, k.short_name), '\s+', '', 'g')"


# Nsight Compute's per-launch Speed Of Light and achieved occupancy (%), averaged per kernel
# weighted by duration; NULL for a timeline.
NCU_KERNEL_METRICS = {"sm_pct": ncu.SM_SOL, "memory_pct": ncu.MEM_SOL, "achieved_occupancy_pct": ncu.ACHIEVED}
_NCU_PIVOT = ", ".join(f"max(value) FILTER (WHERE metric_id = '{m}') AS {c}" for c, m in NCU_KERNEL_METRICS.items())
_NCU_MEANS = ", ".join(f"sum({c} * coalesce(k.duration_ns, 1)) / nullif(sum(coalesce(k.duration_ns, 1)) "
                       f"FILTER (WHERE {c} IS NOT NULL), 0) AS {c}" for c in NCU_KERNEL_METRICS)

# A kernel launched before the capture began: no launch call in the trace, and it starts before
# the run's first API call.
BEFORE_CAPTURE = """coalesce(k.launch_call_id IS NULL AND k.start_ns <
    (SELECT min(start_ns) FROM api_calls WHERE run_id = $run_id), false)"""

KERNELS_SQL = f"""
WITH m AS (
    SELECT kernel_id, {_NCU_PIVOT} FROM kernel_metrics
    WHERE run_id = $run_id AND list_contains({list(NCU_KERNEL_METRICS.values())}, metric_id) GROUP BY kernel_id
)
SELECT {{key}} AS key, min(coalesce(k.short_name, k.name)) AS short_name, min(k.name) AS name, count(*) AS count,
       sum(k.duration_ns) AS total_ns, min(k.kernel_id) AS first_id, {_NCU_MEANS}
FROM kernel_durations k LEFT JOIN m USING (kernel_id)
WHERE k.run_id = $run_id AND NOT {BEFORE_CAPTURE}
GROUP BY key
"""

# A run's copies: their time (timed ones) and bytes.
COPIES_SQL = ("SELECT count(*) AS n, sum(end_ns - start_ns) FILTER (WHERE end_ns >= start_ns) AS ns, sum(bytes) AS bytes "
              "FROM copies WHERE run_id = $run_id")
NOT_COUNTED_SQL = f"SELECT count(*) FROM kernels k WHERE k.run_id = $run_id AND {BEFORE_CAPTURE}"

RANGES_SQL = f"""
SELECT CASE WHEN kind = 'gpu_user_annotation' THEN 'gpu' ELSE 'host' END AS side,
       normalized_name(regexp_replace(name, '{PROFILER_STEP}', '{STEP_KEY}')) AS range,
       count(*) AS count, sum(end_ns - start_ns) AS total_ns
FROM ranges
WHERE run_id = $run_id AND kind <> 'nvtx_mark' AND name IS NOT NULL AND end_ns >= start_ns
GROUP BY ALL
"""

# Per PyTorch operator (`cpu_ops`), its name normalised: calls and host time (nested operators
# are each counted in their own row, as torch.profiler's CPU total).
OPERATORS_SQL = """
SELECT normalized_name(name) AS operator, count(*) AS count, sum(end_ns - start_ns) AS total_ns
FROM cpu_ops WHERE run_id = $run_id AND name IS NOT NULL AND end_ns >= start_ns
GROUP BY ALL
"""

# Per device: busy time (the union of its GPU work) and its idle share of the run's span.
BUSY_SQL = """
SELECT b.device_id, b.busy_ns, 1 - b.busy_ns / nullif(r.span_ns, 0) AS idle_share
FROM this_run.device_busy b JOIN runs r USING (run_id) ORDER BY b.device_id
"""


def _run_row(store: Store, run_id: str) -> dict:
    df = store.df("SELECT run_id, file_name, source_path, format, producer_version, start_ns, end_ns, span_ns "
                  "FROM runs WHERE run_id = ?", [run_id])
    if df.empty:
        raise DiffError(f"no run {run_id!r} in the store")
    return _records(df)[0]


def _scalar(store: Store, sql: str, run_id: str):
    v = store.sql(sql, {"run_id": run_id}).fetchall()[0][0]  # fetchone leaves the result open
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _side(store: Store, run_id: str, by: str, step: str | None) -> dict:
    with run_cache.scoped_to_run(store.con, run_id, build=False):  # a big run's kept cache, when it has one
        busy = store.df(BUSY_SQL)
    setup = comparability.setup(store, run_id)
    step_list = step_stats.step_rows(store, run_id, step)
    dist = step_stats.distribution(step_list)
    memory = summary.memory(store, run_id)
    budget = step_stats.step_budget(store, run_id) if step is None else []
    findings = _findings(store, run_id)
    return {
        "kernels": store.df(KERNELS_SQL.format(key=_kernel_key(by)), {"run_id": run_id}),
        "not_counted": int(_scalar(store, NOT_COUNTED_SQL, run_id) or 0),
        "copies": store.arrow(COPIES_SQL, {"run_id": run_id}).to_pylist()[0],
        "ranges": store.df(RANGES_SQL, {"run_id": run_id}),
        "memory": memory,
        "steps": dist,
        "steady_ns": [r["ns"] for r in step_list[dist["warmup_steps"]:]] if dist else [],
        "busy": busy,
        "setup": setup,
        "roles": comparability.roles(setup, [int(d) for d in busy["device_id"].dropna()],
                                     [r["device_id"] for r in memory], [r["device_id"] for r in budget],
                                     [f["device_id"] for f in findings]),
        "findings": findings,
        "operators": store.df(OPERATORS_SQL, {"run_id": run_id}),
        "step_budget": budget,
        "host_operator_ns": step_stats.host_operator_ns(store, run_id) if step is None else None,
    }


# -- the comparison ---------------------------------------------------------------------

def _join(base: pd.DataFrame, test: pd.DataFrame, on: list[str], keep: list[str]) -> pd.DataFrame:
    """Outer join of the two sides' numbers on `on`; `keep` columns come from whichever side has them."""
    cols = on + keep + ["count", "total_ns"]
    merged = base[cols].merge(test[cols], on=on, how="outer", suffixes=("_base", "_test"))
    for c in keep:
        merged[c] = merged[f"{c}_test"].combine_first(merged[f"{c}_base"])
    out = merged[on + keep].copy()
    for c in ("count", "total_ns"):
        out[f"base_{c}"] = merged[f"{c}_base"].astype("Float64")
        out[f"test_{c}"] = merged[f"{c}_test"].astype("Float64")
    out["count_delta"] = out["test_count"].fillna(0) - out["base_count"].fillna(0)
    out["delta_ns"] = out["test_total_ns"] - out["base_total_ns"]
    out["delta_pct"] = 100 * out["delta_ns"] / out["base_total_ns"].where(out["base_total_ns"] != 0)
    out["status"] = "both"
    out.loc[out["base_count"].isna(), "status"] = "new"
    out.loc[out["test_count"].isna(), "status"] = "gone"
    return out


def _kernel_table(base: pd.DataFrame, test: pd.DataFrame, pair_renamed: bool = False) -> pd.DataFrame:
    """Kernels matched by key; with `pair_renamed` (two Nsight Compute profiles of one program, the
    kernel rewritten under another name), the ones left unmatched on both sides, as many on each,
    are paired in launch order: status `paired`, `test_name` the name in TEST."""
    base, test = base.copy(), test.copy()
    paired = _renamed_pairs(base, test) if pair_renamed else {}
    if paired:  # a test kernel takes its base partner's key; its own name is kept for the table
        test["test_name"] = test["name"]
        test["key"] = test["key"].map(lambda k: paired.get(k, k))
    out = _join(base, test, ["key"], ["short_name", "name"])
    for c in NCU_KERNEL_METRICS:
        out[f"base_{c}"] = out["key"].map(dict(zip(base["key"], base[c]))) if c in base else None
        out[f"test_{c}"] = out["key"].map(dict(zip(test["key"], test[c]))) if c in test else None
    out["test_name"] = None  # a paired kernel's name in TEST (`name` is BASE's)
    if paired:
        renamed = out["key"].isin(set(paired.values()))
        base_names = dict(zip(base["key"], base["name"]))
        test_names = dict(zip(test["key"], test["test_name"]))
        out.loc[renamed, "status"] = "paired"
        out.loc[renamed, "name"] = [base_names[k] for k in out.loc[renamed, "key"]]
        out.loc[renamed, "test_name"] = [test_names[k] for k in out.loc[renamed, "key"]]
    order = out["test_total_ns"].fillna(0) - out["base_total_ns"].fillna(0)
    return (out.assign(_order=order.abs()).sort_values(["_order", "key"], ascending=[False, True])
            .drop(columns="_order").reset_index(drop=True))


def _renamed_pairs(base: pd.DataFrame, test: pd.DataFrame) -> dict:
    """Test key -> base key for the kernels only one side has, when both have as many (launch order)."""
    gone = base[~base["key"].isin(set(test["key"]))].sort_values("first_id")
    new = test[~test["key"].isin(set(base["key"]))].sort_values("first_id")
    if gone.empty or len(gone) != len(new):
        return {}
    return dict(zip(new["key"], gone["key"]))


def _range_table(base: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    out = _join(base, test, ["side", "range"], [])
    out["base_mean_ns"] = out["base_total_ns"] / out["base_count"]
    out["test_mean_ns"] = out["test_total_ns"] / out["test_count"]
    out["mean_delta_pct"] = 100 * (out["test_mean_ns"] - out["base_mean_ns"]) / out["base_mean_ns"].where(out["base_mean_ns"] != 0)
    is_step = out["range"] == STEP_KEY
    biggest = out[["base_total_ns", "test_total_ns"]].max(axis=1)
    return (out.assign(_step=~is_step, _big=biggest).sort_values(["_step", "_big", "side", "range"],
                                                                 ascending=[True, False, True, True])
            .drop(columns=["_step", "_big"]).reset_index(drop=True))


def _by_role(base: pd.DataFrame, test: pd.DataFrame, roles: tuple[dict, dict], on: tuple[str, ...] = ()
             ) -> pd.DataFrame:
    """Outer join of two per-device tables (each with `device_id`) on the device's role (`gpu`)
    and `on`: each run's id kept as `base_device_id` / `test_device_id`."""
    sides = []
    for df, side, role in ((base, "base", roles[0]), (test, "test", roles[1])):
        df = df.copy()
        df["gpu"] = pd.array([role.get(d) if not pd.isna(d) else None for d in df["device_id"]], dtype="Int64")
        sides.append(df.rename(columns={"device_id": f"{side}_device_id"}))
    out = sides[0].merge(sides[1], on=["gpu", *on], how="outer")
    cols = ["gpu", "base_device_id", "test_device_id"]
    for c in cols[1:]:
        out[c] = out[c].astype("Int64")
    return out[cols + [c for c in out.columns if c not in cols]]


def _memory_side(side: str, rows: list[dict]) -> pd.DataFrame:
    """One run's `summary.memory` rows as `<side>_source`, `<side>_peak_bytes` (allocated) and
    `<side>_peak_reserved_bytes` per device."""
    cols = ["device_id", f"{side}_source", f"{side}_peak_bytes", f"{side}_peak_reserved_bytes"]
    return pd.DataFrame([(r["device_id"], r["source"], r["peak_allocated_bytes"], r["peak_reserved_bytes"])
                         for r in rows], columns=cols).astype({cols[2]: "Float64", cols[3]: "Float64"})


def _memory_table(base: list[dict], test: list[dict], roles: tuple[dict, dict]) -> pd.DataFrame:
    """Per device (by role) of either run: each run's source, peak allocated and peak reserved
    bytes, and the change of the peak."""
    out = _by_role(_memory_side("base", base), _memory_side("test", test), roles)
    out["delta_bytes"] = out["test_peak_bytes"] - out["base_peak_bytes"]
    out["delta_pct"] = 100 * out["delta_bytes"] / out["base_peak_bytes"].where(out["base_peak_bytes"] != 0)
    return out.sort_values("gpu").reset_index(drop=True)


def _category_table(base: list[dict], test: list[dict], roles: tuple[dict, dict]) -> pd.DataFrame:
    """Per device (by role) both runs split by category: each category's bytes at each run's peak
    (0 where a run's peak held none of it) and the change, largest change first."""
    cols = ["gpu", "base_device_id", "test_device_id", "category", "base_bytes", "test_bytes", "delta_bytes",
            "delta_pct"]
    split = {side: {role.get(r["device_id"]): (r["device_id"], {c["category"]: c["bytes"] for c in r["categories"]})
                    for r in rows if r["categories"]}
             for side, rows, role in (("base", base, roles[0]), ("test", test, roles[1]))}
    rows = []
    for gpu in sorted(split["base"].keys() & split["test"].keys(), key=lambda g: (g is None, g)):
        (bd, b), (td, t) = split["base"][gpu], split["test"][gpu]
        for category in sorted(b.keys() | t.keys()):
            nb, nt = b.get(category, 0), t.get(category, 0)
            rows.append({"gpu": gpu, "base_device_id": bd, "test_device_id": td, "category": category,
                         "base_bytes": nb, "test_bytes": nt,
                         "delta_bytes": nt - nb, "delta_pct": 100 * (nt - nb) / nb if nb else None})
    df = pd.DataFrame(rows, columns=cols)
    if df.empty:
        return df
    return (df.assign(_order=-df["delta_bytes"].abs()).sort_values(["gpu", "_order", "category"])
            .drop(columns="_order").reset_index(drop=True))


def _step_metric(steps: tuple[dict | None, dict | None], step: str | None,
                 steady: tuple[list, list] = ([], [])) -> Metric | None:
    """Median step time (warm-up steps left out) when both runs have steps: of the ranges named
    `step`, else of the `steps` view's; with the p-value of the medians' difference over the
    steady steps (`steady`: `median_test_p`)."""
    base, test = steps
    if base is None or test is None:
        if step is not None:
            raise DiffError(f"--step {step!r}: no range of that name in both runs")
        return None
    label = base["step"] if base["step"] == test["step"] else "step"
    side = " (host)" if step is None or base.get("side", "host") == "host" else ""
    return Metric(f"median {label}{side}", "ns", float(base["median_ns"]), float(test["median_ns"]),
                  p_value=median_test_p(*steady))


def _matched(kernels: pd.DataFrame) -> pd.DataFrame:
    """The kernel table's rows of kernels both runs have (by name, or paired when renamed)."""
    return kernels[kernels["status"].isin(["both", "paired"])]


def _throughput(kernels: pd.DataFrame, base: dict, test: dict) -> Metric | None:
    """Launches per second of the kernels both runs have, over each run's span."""
    both = _matched(kernels)
    if both.empty or not base["span_ns"] or not test["span_ns"]:
        return None
    return Metric("matched kernel launches per second", "per_s", 1e9 * float(both["base_count"].sum()) / base["span_ns"],
                  1e9 * float(both["test_count"].sum()) / test["span_ns"], better="higher")


def _busy_metrics(b: pd.DataFrame, t: pd.DataFrame) -> list[Metric]:
    """Busy time of the busiest device (a union within one device) and the mean idle share."""
    def agg(df, col, how):
        return _num(getattr(df[col], how)()) if not df.empty else None
    return [Metric("GPU busy, busiest device (union of its GPU work)", "ns", agg(b, "busy_ns", "max"), agg(t, "busy_ns", "max")),
            Metric("GPU idle share of the span, mean over devices", "share", agg(b, "idle_share", "mean"),
                   agg(t, "idle_share", "mean"))]


def _busy_table(b: pd.DataFrame, t: pd.DataFrame, roles: tuple[dict, dict]) -> pd.DataFrame:
    out = _by_role(b.rename(columns={"busy_ns": "base_busy_ns", "idle_share": "base_idle_share"}),
                   t.rename(columns={"busy_ns": "test_busy_ns", "idle_share": "test_idle_share"}), roles)
    return out.sort_values("gpu").reset_index(drop=True)


def _per_step(table: pd.DataFrame, steps: tuple[dict | None, dict | None]) -> pd.DataFrame:
    """`table` with each row's time per step (`base_per_step_ns`, `test_per_step_ns`) when both
    runs have steps: its total over the run's step count."""
    base, test = steps
    if base is None or test is None or table.empty:
        return table
    return table.assign(base_per_step_ns=table["base_total_ns"] / base["steps"],
                        test_per_step_ns=table["test_total_ns"] / test["steps"])


def _operator_table(base: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    """Operators matched by normalised name, the largest change of total host time first."""
    out = _join(base, test, ["operator"], [])
    order = (out["test_total_ns"].fillna(0) - out["base_total_ns"].fillna(0)).abs()
    return (out.assign(_order=order).sort_values(["_order", "operator"], ascending=[False, True])
            .drop(columns="_order").reset_index(drop=True))


def _step_budget_table(base: list[dict], test: list[dict], roles: tuple[dict, dict]) -> pd.DataFrame:
    """Per device (by role) and budget part: each run's mean time per steady step, and the change."""
    cols = ["device_id", "category", "cause", "per_step_ns"]
    b, t = pd.DataFrame(base, columns=cols), pd.DataFrame(test, columns=cols)
    if b.empty or t.empty:
        return pd.DataFrame()
    on = ("category", "cause")
    b["cause"], t["cause"] = b["cause"].fillna(""), t["cause"].fillna("")
    out = _by_role(b.rename(columns={"per_step_ns": "base_per_step_ns"}),
                   t.rename(columns={"per_step_ns": "test_per_step_ns"}), roles, on)
    # A device one run has and the other lacks keeps its own id on both sides' parts.
    for side in ("base", "test"):
        ids = out.groupby("gpu")[f"{side}_device_id"].transform("first")
        out[f"{side}_device_id"] = out[f"{side}_device_id"].fillna(ids)
    out[["base_per_step_ns", "test_per_step_ns"]] = out[["base_per_step_ns", "test_per_step_ns"]].fillna(0.0)
    out["delta_ns"] = out["test_per_step_ns"] - out["base_per_step_ns"]
    out["cause"] = out["cause"].replace("", None)
    order = ["gpu", *on]
    return out.sort_values(order, key=lambda c: c.fillna("") if c.name == "cause" else c).reset_index(drop=True)


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _finding_key(f: dict, role: dict) -> tuple:
    """A finding is "the same" in BASE and TEST when rule, place and subject are: the
    fingerprint without the run's rank, and its device by role (`role`: device id -> local GPU
    index), since two runs compared may be other ranks of a job."""
    key = [None if f[k] is None or (isinstance(f[k], float) and math.isnan(f[k])) else f[k]
           for k in ("rule_id", "device_id", "stream_id", "item_kind", "item_name")]
    key[1] = role.get(key[1], key[1]) if key[1] is not None else None
    return tuple(key)


def _findings(store: Store, run_id: str) -> list[dict]:
    return store.arrow("""
        SELECT rule_id, severity, device_id, stream_id, item_kind, item_name, message, est_loss_ns, fingerprint
        FROM findings WHERE run_id = $run_id
        ORDER BY finding_no NULLS LAST, CASE severity WHEN 'error' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END,
                 rule_id, fingerprint""",
                       {"run_id": run_id}).to_pylist()


def _finding_changes(base: list[dict], test: list[dict], roles: tuple[dict, dict], renamed: dict | None = None
                     ) -> tuple[list[dict], list[dict], int]:
    """New and fixed findings, compared as multisets of keys (devices by role: `roles`, each
    run's device id -> local GPU index); a test finding on a kernel paired with a renamed base
    kernel (`renamed`: test name -> base name) is keyed by the base name."""
    as_base = [{**f, "item_name": renamed.get(f["item_name"], f["item_name"])} if renamed else f for f in test]
    new_keys = {id(f) for f in _unmatched(as_base, roles[1], base, roles[0])}
    new = [f for f, g in zip(test, as_base) if id(g) in new_keys]
    fixed = _unmatched(base, roles[0], as_base, roles[1])
    return new, fixed, len(test) - len(new)


def _unmatched(items: list[dict], role: dict, others: list[dict], others_role: dict) -> list[dict]:
    """The findings of `items` left over once each is paired with an equal-keyed one of `others`."""
    left = Counter(_finding_key(f, others_role) for f in others)
    out = []
    for f in items:
        k = _finding_key(f, role)
        if left[k] > 0:
            left[k] -= 1
        else:
            out.append(f)
    return out


def diff_runs(store: Store, base_id: str, test_id: str, *, by: str = "name", step: str | None = None) -> RunDiff:
    """Compare two stored runs (rules must have run on both for the findings part); `step`
    names the range that marks one step (default: the `steps` view's)."""
    if by not in ("name", "short"):
        raise DiffError(f"--by must be name or short, not {by!r}")
    base, test = _run_row(store, base_id), _run_row(store, test_id)
    b, t = _side(store, base_id, by, step), _side(store, test_id, by, step)
    roles = run_roles(store, [base_id, test_id])
    profiles = roles.get(base_id) == roles.get(test_id) == "ncu"
    kernels = _kernel_table(b["kernels"], t["kernels"], pair_renamed=profiles)
    pairs = kernels[kernels["status"] == "paired"]
    renamed = dict(zip(pairs["test_name"], pairs["name"]))
    ranges = _range_table(b["ranges"], t["ranges"])
    roles = (b["roles"], t["roles"])
    memory = _memory_table(b["memory"], t["memory"], roles)
    categories = _category_table(b["memory"], t["memory"], roles)

    kernel_total = Metric(KERNEL_TIME, "ns",
                          _num(b["kernels"]["total_ns"].sum(min_count=1)), _num(t["kernels"]["total_ns"].sum(min_count=1)))
    span = Metric("span", "ns", _num(base["span_ns"]), _num(test["span_ns"]))
    steps = _step_metric((b["steps"], t["steps"]), step, (b["steady_ns"], t["steady_ns"]))
    sliced = "time-sliced" in (b["setup"]["capture"], t["setup"]["capture"])
    throughput = _throughput(kernels, base, test) if sliced and steps is None else None
    peak = Metric("peak allocated, max over devices", "bytes", _peak(b["memory"]), _peak(t["memory"]))
    host_ops = (Metric("host operator time per step (mean, top-level operators)", "ns",
                       b["host_operator_ns"], t["host_operator_ns"])
                if b["host_operator_ns"] is not None and t["host_operator_ns"] is not None else None)
    copies = _copy_metrics(b["copies"], t["copies"])
    metrics = [m for m in (span, steps, throughput, *_busy_metrics(b["busy"], t["busy"]), kernel_total, *copies,
                           host_ops) if m is not None]
    # A time-sliced capture's span is the window it was cut to: never the end-to-end time.
    order = (steps, throughput, kernel_total) if sliced else (steps, span, kernel_total)
    end_to_end = next((m for m in order if m is not None and m.comparable), None)
    step_pair = (b["steps"], t["steps"])

    new, fixed, same = _finding_changes(b["findings"], t["findings"], roles, renamed)
    return RunDiff(base, test, by, _per_step(kernels, step_pair), _per_step(ranges, step_pair), memory, categories,
                   metrics, end_to_end, peak, new, fixed, same,
                   setups={"base": b["setup"], "test": t["setup"]},
                   reasons=comparability.reasons(b["setup"], t["setup"]),
                   unknowns=comparability.unknowns(b["setup"], t["setup"]),
                   steps={"base": b["steps"], "test": t["steps"]}, busy=_busy_table(b["busy"], t["busy"], roles),
                   not_counted={"base": b["not_counted"], "test": t["not_counted"]},
                   step_budget=_step_budget_table(b["step_budget"], t["step_budget"], roles),
                   operators=_per_step(_operator_table(b["operators"], t["operators"]), step_pair))


def _copy_metrics(base: dict, test: dict) -> list[Metric]:
    """Copy time and bytes (sums over the whole capture, as kernel time), where either run copied."""
    if not base["n"] and not test["n"]:
        return []
    return [Metric("copy time (sum)", "ns", _num(base["ns"] or 0), _num(test["ns"] or 0)),
            Metric("bytes copied", "bytes", _num(base["bytes"] or 0), _num(test["bytes"] or 0))]


def _peak(rows: list[dict]) -> float | None:
    peaks = [r["peak_allocated_bytes"] for r in rows if r["peak_allocated_bytes"] is not None]
    return float(max(peaks)) if peaks else None
