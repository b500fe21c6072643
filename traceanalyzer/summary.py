"""Per-run summary numbers: top kernels, copies by direction and memory kind, GPU busy share.

Each function returns a pandas DataFrame; presentation is the CLI's and the reports' job.
"""

from __future__ import annotations

import pandas as pd

from .store import Store, views

# Kernel time from `kernel_durations`: the timeline's, or for ncu (no timeline) the measured one.
TOP_KERNELS_SQL = """
WITH k AS (
    SELECT coalesce(short_name, name) AS kernel, duration_ns AS dur_ns
    FROM kernel_durations WHERE run_id = ? AND duration_ns IS NOT NULL
)
SELECT kernel, count(*) AS count, sum(dur_ns) AS total_ns, avg(dur_ns) AS mean_ns,
       median(dur_ns) AS median_ns, min(dur_ns) AS min_ns, max(dur_ns) AS max_ns,
       sum(dur_ns) / nullif((SELECT sum(dur_ns) FROM k), 0) AS share
FROM k GROUP BY kernel ORDER BY total_ns DESC, kernel LIMIT ?
"""

COPIES_SQL = """
SELECT direction || CASE WHEN unified_memory THEN ' (unified memory)' ELSE '' END AS direction,
       coalesce(src_kind, '?') || ' -> ' || coalesce(dst_kind, '?') AS memory_kinds,
       count(*) AS count, sum(bytes) AS bytes, sum(end_ns - start_ns) AS total_ns,
       sum(bytes) / nullif(sum(end_ns - start_ns), 0) AS bandwidth_gb_per_s
FROM copies WHERE run_id = ?
GROUP BY ALL ORDER BY total_ns DESC NULLS LAST, direction, memory_kinds
"""

BUSY_SQL = """
SELECT b.device_id, d.name AS device, b.busy_ns, b.active_span_ns, b.busy_share,
       b.busy_ns / nullif(r.span_ns, 0) AS busy_share_of_run
FROM device_busy b JOIN runs r USING (run_id)
LEFT JOIN devices d ON d.run_id = b.run_id AND d.device_id = b.device_id
WHERE b.run_id = ? ORDER BY b.device_id
"""


def run_info(store: Store, run_id: str) -> dict:
    df = store.df("SELECT * FROM runs WHERE run_id = ?", [run_id])
    return df.iloc[0].to_dict()


def top_kernels(store: Store, run_id: str, limit: int = 15) -> pd.DataFrame:
    return store.df(TOP_KERNELS_SQL, [run_id, limit])


def copies(store: Store, run_id: str) -> pd.DataFrame:
    return store.df(COPIES_SQL, [run_id])


def busy(store: Store, run_id: str) -> pd.DataFrame:
    with views.kept_views(store.con, run_id):  # a big run's kept cache, when it has one
        return store.df(BUSY_SQL, [run_id])
