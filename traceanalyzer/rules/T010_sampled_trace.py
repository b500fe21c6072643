"""T010 sampled or stripped trace: the events needed to tell why the GPU sat idle are missing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from . import _unknown
from .base import Rule, Threshold
from .evidence import Evidence, doc

if TYPE_CHECKING:
    import pandas as pd

_SIGNAL_TEXT = {
    "no_launch_calls": "no GPU operation has its launch call",
    "launches_missing": "{unlaunched} of the {after} GPU operations that follow a launched one on their stream have "
                        "no launch call ({unlaunched_pct})",
    "events_thinned": "the {ops} recorded operators are {density_pct} of the ids between the first and last, "
                      "skipped at {jump_pct} of the steps",
}


def evaluate(store, run_id: str, p: dict) -> pd.DataFrame:
    import pandas as pd

    g = _unknown.gaps(store, run_id, p)
    if not g["signals"]:
        return pd.DataFrame()
    values = {"unlaunched": g["unlaunched_ops"], "after": g["ops_after_launched"],
              "unlaunched_pct": _unknown._pct(g["unlaunched_share"]), "ops": g["op_ids"],
              "density_pct": _unknown._pct(g["op_id_density"]), "jump_pct": _unknown._pct(g["op_id_jump_share"])}
    said = "; ".join(_SIGNAL_TEXT[s].format(**values) for s in g["signals"])
    start, end = store.sql("SELECT min(start_ns), max(end_ns) FROM gpu_activity WHERE run_id = $r",
                           {"r": run_id}).fetchone()
    evidence = {k: g[k] for k in ("gpu_ops", "launched_ops", "ops_after_launched", "unlaunched_ops",
                                   "unlaunched_share", "cpu_ops", "op_ids", "op_id_jump_share", "op_id_density",
                                   "signals")}
    evidence.update(cause=_unknown.CAUSE_UNKNOWN, missing=g["missing"])
    # the measure: the share of what should be there that is not
    value = max(g["unlaunched_share"] if "launches_missing" in g["signals"] else 0.0,
                1.0 if "no_launch_calls" in g["signals"] else 0.0,
                1 - g["op_id_density"] if "events_thinned" in g["signals"] else 0.0)
    return pd.DataFrame([{
        "device_id": None, "stream_id": None, "item_kind": "run", "item_id": None, "item_name": "sampled trace",
        "start_ns": start, "end_ns": end, "value": value, "value_unit": "share", "threshold": None,
        "est_loss_ns": None,
        "message": (f"the trace is sampled or stripped: {said}; between the recorded GPU operations ran others it no "
                    f"longer holds, so its idle stretches cannot be attributed to a cause"),
        "hint": _unknown.unknown_hint(g["missing"]),
        "evidence": evidence,
    }])


# What a finding's evidence holds: the rule's JSON as a type, listed on its doc page
# (rules/evidence.py); the query above writes it, this only declares and reads it.
class T010Evidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    cause: Annotated[str, doc("`unknown`: the idle causes of the run cannot be told")]
    missing: Annotated[list[str], doc("what the trace lacks, and how to record it")]
    cpu_ops: Annotated[int, doc("host operators in the trace")]
    gpu_ops: Annotated[int, doc("GPU operations in the trace")]
    launched_ops: Annotated[int, doc("host operators that launched GPU work")]
    op_id_density: Annotated[float, doc("operator ids recorded per id range (1 when none were dropped)")]
    op_id_jump_share: Annotated[float, doc("share of id steps that skip ids")]
    op_ids: Annotated[int, doc("operator ids recorded")]
    ops_after_launched: Annotated[int, doc("host operators after the last one that launched GPU work")]
    signals: Annotated[list[str], doc("what shows ops were dropped")]
    unlaunched_ops: Annotated[int, doc("host operators that launched nothing")]
    unlaunched_share: Annotated[float, doc("share of operators that launched nothing")]


RULE = Rule(
    id="T010",
    evidence=T010Evidence,
    name="sampled-trace",
    title="Sampled or stripped trace: idle time cannot be attributed",
    phase="timeline",
    severity="warning",
    what="Runs whose events were sampled, filtered or stripped so that the events needed to attribute the "
         "GPU's idle time are missing: GPU operations without their launch call where the stream shows they "
         "were launched inside the recording, PyTorch operators whose ids skip most numbers, regularly, or no "
         "launch call at all.",
    why="An idle cause is read from the operation that ends an idle stretch and its launch call. In a "
        "sampled trace other work ran between the recorded operations: the stretches are not known to be "
        "idle, and a cause named for them is a guess. The idle-cause rules (T001, T003, T004, T006) and the "
        "overlap rules (T002, T007) then say `cause: unknown` with what is missing instead of a fix, at most "
        "info; T009 says nothing.",
    how="Three signals, each over the run. (1) A stream runs its work in launch order, so a GPU operation "
        "after the stream's first launched one was launched inside the recording: of those (unified-memory "
        "migrations aside), the share without a launch call (`unlaunched_share`), at least "
        "`min_unlaunched_count` and `min_unlaunched_share`. Operations before it may have been launched before "
        "the recording began (a queue runs up to seconds behind the host) and say nothing. (2) The PyTorch "
        "profiler numbers operators in order (`External id`): a complete window skips ids at few steps (on the "
        "complete real traces at most 15% of the steps, most under 4%; a ROCm trace skips 470 ids in one step), "
        "HTA's sampled ones at 63%; fires when at least `min_ops_count` operators hold at most `max_id_density_share` of their id range "
        "and skip at `min_id_jump_share` of the steps or more. (3) No launch call for any GPU operation. "
        "Only runs with at least `min_gpu_ops_count` GPU operations (fewer have no gap to attribute). "
        "No loss: the finding says what the trace lacks (`evidence.missing`).",
    fix="Record the whole window unsampled and keep every event: torch.profiler with activities=[CPU, CUDA] "
        "and no trace sampling or filtering before analysis; nsys profile -t cuda,nvtx,osrt.",
    requires="timed GPU operations",
    applies_sql="SELECT EXISTS (SELECT 1 FROM gpu_activity WHERE run_id = $run_id)",
    thresholds=(
        Threshold("min_gpu_ops_count", 2, "A run needs at least this many GPU operations (fewer have no gap to "
                  "attribute).", low=1),
        Threshold("min_unlaunched_share", 0.05, "Share of the operations after a launched one on their stream "
                  "that lack a launch call, from which launches count as missing (0 on every complete real trace)."),
        Threshold("min_unlaunched_count", 2, "...and at least this many of them.", low=1),
        Threshold("min_ops_count", 5, "Operator ids are judged from this many operators on.", low=2),
        Threshold("min_id_jump_share", 0.3, "Share of the steps between consecutive operator ids that skip ids, "
                  "from which the operators count as thinned."),
        Threshold("max_id_density_share", 0.5, "...with the recorded operators at most this share of their id range."),
    ),
    evaluate=evaluate,
    references=(
        "PyTorch profiler: External id links operators, runtime calls and kernels (Kineto trace format)",
        "Holistic Trace Analysis: trace filters and sampled traces",
    ),
)
