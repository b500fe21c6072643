"""NVIDIA's own verdicts beside ours, for runs whose Nsight Compute report carries them
(`kernel_rule_results`: CSV rule rows, `.ncu-rep` rule results, a text report's OPT/WRN lines).

A finding about a kernel agrees with NVIDIA when one of NVIDIA's actionable results (`OPT`,
`WRN`) on a launch of the same kernel comes from a rule its own rule names as its counterpart
(`Rule.nvidia`: rule identifier and message pattern). NVIDIA's actionable results that no
finding of ours matches are listed per run, so a user sees both sides.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..rules import get_rule

if TYPE_CHECKING:
    from ..store import Store

ACTIONABLE = ("OPT", "WRN")


def vendor_results(store: Store, run_ids: list[str]) -> dict[str, list[dict]]:
    """Per run, NVIDIA's actionable rule results with the kernel they are about (none: no key)."""
    rows = store.arrow(
        "SELECT r.run_id, k.name AS kernel, r.rule_name AS rule, r.rule_type AS type, r.section, "
        "r.estimated_speedup_pct AS speedup_pct, r.description AS message "
        "FROM kernel_rule_results r JOIN kernels k USING (run_id, kernel_id) "
        "WHERE list_contains(?, r.run_id) AND list_contains(?, r.rule_type) "
        "ORDER BY r.run_id, k.name, r.rule_name, r.description", [list(run_ids), list(ACTIONABLE)]).to_pylist()
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r.pop("run_id"), []).append(r)
    return out


def _matches(rule_id: str, result: dict) -> bool:
    try:
        patterns = get_rule(rule_id).nvidia
    except KeyError:
        return False
    return any(result["rule"] == name and re.search(pattern, result["message"] or "") for name, pattern in patterns)


def verdict(finding: dict, results: list[dict] | None) -> dict | None:
    """NVIDIA's verdict on what `finding` says: {"flagged": True, "rule", "type", "speedup_pct",
    "message"} from the first matching result, {"flagged": False} when NVIDIA's rules did not flag
    the kernel for it, None when the run has no NVIDIA results or the rule has no counterpart."""
    if not results or finding.get("item_kind") != "kernel" or not get_rule(finding["rule_id"]).nvidia:
        return None
    hit = next((r for r in results if r["kernel"] == finding["item_name"] and _matches(finding["rule_id"], r)), None)
    if hit is None:
        return {"flagged": False}
    return {"flagged": True, **{k: hit[k] for k in ("rule", "type", "speedup_pct", "message")}}


def unmatched(results: list[dict] | None, findings: list[dict]) -> list[dict]:
    """NVIDIA's actionable results that no finding of the run (headline or related) matches."""
    ours = [(f["item_name"], f["rule_id"]) for f in findings if f.get("item_kind") == "kernel"]
    seen, out = set(), []
    for r in results or ():  # once per kernel, rule and message (NVIDIA repeats them per launch)
        key = (r["kernel"], r["rule"], r["type"], r["message"])
        if key not in seen and not any(k == r["kernel"] and _matches(rule, r) for k, rule in ours):
            seen.add(key)
            out.append(r)
    return out


def _speedup(v: dict) -> str:
    return "" if v.get("speedup_pct") is None else f", est. speedup {v['speedup_pct']:.3g}%"


def vendor_text(v: dict) -> str:
    """A finding's NVIDIA verdict in words."""
    if not v["flagged"]:
        return "none of its rules flags this kernel for it"
    return f"flagged too ({v['rule']} {v['type']}{_speedup(v)})"


def result_text(v: dict) -> str:
    """One of NVIDIA's results in words: type, rule, kernel, estimated speedup, message."""
    kernel = v["kernel"] if len(v["kernel"]) <= 80 else v["kernel"][:79] + "…"
    return f"{v['type']} {v['rule'] or '?'} on {kernel}{_speedup(v)}: {v['message'] or ''}"
