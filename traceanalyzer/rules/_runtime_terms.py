"""Advice in the terms of the run's GPU runtime. Rules write their hints with CUDA's API names; on
a run whose GPUs are all AMD's the hints name HIP's (`hipMemcpyAsync`, HIP graphs), which is
what its code calls (ROCm's PyTorch keeps `torch.cuda`: those names stay)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..store import run_cache

if TYPE_CHECKING:
    import pandas as pd

    from ..store import Store

# HIP's names where they are not CUDA's with the prefix changed.
_HIP_NAMES = {"cudaHostAlloc": "hipHostMalloc"}
_API = re.compile(r"\bcuda([A-Z]\w*)")
_GRAPHS = re.compile(r"\bCUDA (graphs?)\b")  # not "CUDA/HIP graphs", which says both

AMD_ONLY_SQL = ("SELECT count(*) > 0 AND count(*) FILTER (WHERE vendor = 'amd') = count(*) FROM devices "
                "WHERE run_id = ?")


def in_hip_terms(text: str) -> str:
    text = _API.sub(lambda m: _HIP_NAMES.get(m.group(0), "hip" + m.group(1)), text)
    return _GRAPHS.sub(r"HIP \1", text)


def in_run_terms(store: Store, run_id: str, findings: pd.DataFrame) -> pd.DataFrame:
    """`findings` (a rule's) with their hints in HIP's terms on a run whose GPUs are all AMD's."""
    if findings.empty or "hint" not in findings or not _amd_only(store, run_id):
        return findings
    return findings.assign(hint=[h if not isinstance(h, str) else in_hip_terms(h) for h in findings["hint"]])


def _amd_only(store: Store, run_id: str) -> bool:
    """Whether the run's GPUs are all AMD's: asked once per run in a rules pass (its memo)."""
    return run_cache.memo_for(store.run_cache, run_id, "amd_only",
                              lambda: bool(store.sql(AMD_ONLY_SQL, [run_id]).fetchone()[0]))
