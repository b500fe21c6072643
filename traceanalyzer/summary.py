"""Per-run summary numbers: kernels, CUDA-graph executions, copies, memsets, GPU busy share.

Kernel statistics are those of NVIDIA's `nsys stats --report cuda_gpu_kern_sum`: per kernel
name (the full, demangled name, or with `by="base"` the base name without template arguments,
nsys's `:base`), the count, total, average, median, min, max and sample standard deviation
(0 for a single launch, as nsys prints it) of the launches' times, and the share of the total
over all kernels. Rows come in nsys's order: total time down, then count, then name.

Whole-graph executions (nsys `--cuda-graph-trace=graph`: the store's `kernels` rows that
ingest names `[CUDA graph N]`, short name `[CUDA graph]`, with `graph_id` set) are no kernel:
nsys's kernel summary leaves them out, and so do the kernel rows and shares here; they have
rows of their own (`graph_stats`). Kernels traced one by one inside a graph are kernels.

The functions return plain rows (`run_summary`, a JSON-ready dict) or pandas DataFrames (for
the reports); presentation is the CLI's and the reports' job, except `distinct_labels`, which
shortens kernel names for any of them.
"""

from __future__ import annotations

import pandas as pd

from .store import Store, views

# A whole-graph execution as ingest stores it (ingest/nsys.py); never a kernel's name.
GRAPH_EXECUTION = "(graph_id IS NOT NULL AND short_name = '[CUDA graph]')"

# What a kernel row is grouped by: nsys's default (demangled name) or its `:base` (short name).
GROUP_KEYS = {"name": "coalesce(name, short_name, '?')", "base": "coalesce(short_name, name, '?')"}

# Kernel time from `kernel_durations`: the timeline's, or for ncu (no timeline) the measured one.
STATS_SQL = """
WITH k AS (
    -- whole ns (ncu's measured durations can have fractions)
    SELECT {key} AS name, CAST(round(duration_ns) AS BIGINT) AS d
    FROM kernel_durations WHERE run_id = ? AND duration_ns IS NOT NULL AND {which}
), s AS (
    SELECT name, count(*) AS count, CAST(sum(d) AS BIGINT) AS total_ns, avg(d) AS avg_ns, median(d) AS median_ns,
           min(d) AS min_ns, max(d) AS max_ns, coalesce(stddev_samp(d), 0) AS stddev_ns
    FROM k GROUP BY name
)
SELECT *, total_ns / nullif(sum(total_ns) OVER (), 0) AS share
FROM s ORDER BY total_ns DESC, count, name
"""

COPIES_SQL = """
SELECT direction || CASE WHEN unified_memory THEN ' (unified memory)' ELSE '' END AS direction,
       coalesce(src_kind, '?') || ' -> ' || coalesce(dst_kind, '?') AS memory_kinds,
       count(*) AS count, CAST(sum(bytes) AS BIGINT) AS bytes, CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns,
       sum(bytes) / nullif(sum(end_ns - start_ns), 0) AS bandwidth_gb_per_s
FROM copies WHERE run_id = ?
GROUP BY ALL ORDER BY total_ns DESC NULLS LAST, direction, memory_kinds
"""

MEMSETS_SQL = """
SELECT coalesce(mem_kind, '?') AS memory_kind, count(*) AS count, CAST(sum(bytes) AS BIGINT) AS bytes,
       CAST(sum(end_ns - start_ns) AS BIGINT) AS total_ns,
       sum(bytes) / nullif(sum(end_ns - start_ns), 0) AS bandwidth_gb_per_s
FROM memsets WHERE run_id = ?
GROUP BY ALL ORDER BY total_ns DESC NULLS LAST, memory_kind
"""

BUSY_SQL = """
SELECT b.device_id, d.name AS device, CAST(b.busy_ns AS BIGINT) AS busy_ns, CAST(b.active_span_ns AS BIGINT) AS active_span_ns,
       b.busy_share,
       b.busy_ns / nullif(r.span_ns, 0) AS busy_share_of_run
FROM device_busy b JOIN runs r USING (run_id)
LEFT JOIN devices d ON d.run_id = b.run_id AND d.device_id = b.device_id
WHERE b.run_id = ? ORDER BY b.device_id
"""

RUN_FIELDS = ("run_id", "file_name", "format", "producer", "producer_version", "host", "span_ns")


def _stats_sql(by: str, graphs: bool) -> str:
    if by not in GROUP_KEYS:
        raise ValueError(f"kernels are grouped by one of {', '.join(GROUP_KEYS)}, not {by!r}")
    # A graph execution keeps its own name ([CUDA graph N]) unless grouped by base.
    return STATS_SQL.format(key=GROUP_KEYS[by], which=GRAPH_EXECUTION if graphs else f"NOT {GRAPH_EXECUTION}")


def kernel_stats(store: Store, run_id: str, by: str = "name") -> pd.DataFrame:
    """Per kernel (grouped `by` "name" or "base"): name, count, total_ns, avg_ns, median_ns,
    min_ns, max_ns, stddev_ns, share (of all kernels' total); graph executions left out."""
    return store.df(_stats_sql(by, graphs=False), [run_id])


def graph_stats(store: Store, run_id: str, by: str = "name") -> pd.DataFrame:
    """The same per CUDA graph (whole-graph executions); share is of all graph executions' total."""
    return store.df(_stats_sql(by, graphs=True), [run_id])


def top_kernels(store: Store, run_id: str, limit: int = 15) -> pd.DataFrame:
    """The reports' top kernels by base name: kernel, count, total_ns, mean_ns, median_ns,
    min_ns, max_ns, stddev_ns, share (graph executions left out)."""
    df = kernel_stats(store, run_id, by="base").head(limit)
    return df.rename(columns={"name": "kernel", "avg_ns": "mean_ns"})


def copies(store: Store, run_id: str) -> pd.DataFrame:
    return store.df(COPIES_SQL, [run_id])


def memsets(store: Store, run_id: str) -> pd.DataFrame:
    return store.df(MEMSETS_SQL, [run_id])


def busy(store: Store, run_id: str) -> pd.DataFrame:
    with views.kept_views(store.con, run_id):  # a big run's kept cache, when it has one
        return store.df(BUSY_SQL, [run_id])


def run_summary(store: Store, run_id: str, by: str = "name", top: int | None = None) -> dict:
    """The run's summary as JSON-ready values: the run's fields, `by`, `busy` (per device),
    `kernels` (the `top` first rows of `kernel_stats`, all when None), `kernel_totals`
    (`names`, `count`, `total_ns` over every kernel), `graphs`, `copies` and `memsets`."""
    def rows(sql: str, params: list) -> list[dict]:
        return store.arrow(sql, params).to_pylist()

    info = rows(f"SELECT {', '.join(RUN_FIELDS)} FROM runs WHERE run_id = ?", [run_id])[0]
    kernels = rows(_stats_sql(by, graphs=False), [run_id])
    with views.kept_views(store.con, run_id):
        gpus = rows(BUSY_SQL, [run_id])
    return {
        **info, "by": by, "busy": gpus,
        "kernels": kernels if top is None else kernels[:top],
        "kernel_totals": {"names": len(kernels), "count": sum(k["count"] for k in kernels),
                          "total_ns": sum(k["total_ns"] for k in kernels)},
        "graphs": [{k: v for k, v in g.items() if k != "share"} for g in rows(_stats_sql(by, graphs=True), [run_id])],
        "copies": rows(COPIES_SQL, [run_id]),
        "memsets": rows(MEMSETS_SQL, [run_id]),
    }


# -- kernel names in a fixed width ---------------------------------------------------------

ELLIPSIS = "…"
# What separates the words of a kernel name: the template arguments, namespaces, parameters
# of C++ names and the fields of library names (sm80_xmma_gemm_..._tilesize64x256x8_...).
_SEPARATORS = frozenset(" _<>(),:*&[]{}")


def distinct_labels(names: list[str], width: int) -> list[str]:
    """`names` in at most `width` characters each, different names kept different.

    A name that fits stays whole. A longer one keeps its start and, for each other name in the
    list, the word (between `_ <>(),:` and the like) where the two first differ, such as the template argument or tile size that tells two GEMMs apart, with
    "…" for each stretch left out; leftover room extends the start. Where words of two names
    sit in different places and the labels still come out equal, those names are returned
    whole (the caller wraps them)."""
    labels = [_label(s, [t for t in names if t != s], width) for s in names]
    seen: dict[str, set[str]] = {}
    for s, lab in zip(names, labels):
        seen.setdefault(lab, set()).add(s)
    return [s if len(seen[lab]) > 1 else lab for s, lab in zip(names, labels)]


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _word(s: str, p: int) -> tuple[int, int, int]:
    """The word of `s` holding position `p` (the word before, when `p` is a separator or the
    end), as (start, end, p)."""
    p = min(p, len(s) - 1)
    a = p
    while a > 0 and s[a - 1] not in _SEPARATORS:
        a -= 1
    b = p + 1
    while b < len(s) and s[b] not in _SEPARATORS:
        b += 1
    return a, b, p


def _narrow(word: tuple[int, int, int], context: int | None) -> tuple[int, int]:
    """The word, or at most `context` characters of it either side of where it differs."""
    a, b, p = word
    return (a, b) if context is None else (max(a, p - context), min(b, p + context + 1))


def _label(s: str, others: list[str], width: int) -> str:
    if len(s) <= width:
        return s
    if width < 8:
        return s[: max(width - 1, 0)] + ELLIPSIS
    # Where s first differs from each other name: the words to keep, left to right.
    words = sorted({_word(s, _common_prefix(s, t)) for t in others})
    head = max(width // 4, 4)
    for context in (None, 6, 3, 1, 0):  # narrow the kept words until they fit
        spans = [(0, head)] + [_narrow(w, context) for w in words]
        if len(_join(s, spans)) <= width:
            break
    else:  # more differences than the width holds: the first ones that fit
        spans = [(0, head)]
        for w in words:
            if len(_join(s, spans + [_narrow(w, 0)])) > width:
                break
            spans.append(_narrow(w, 0))
    text = _join(s, spans)
    while len(text) < width:  # room left: show more of the start (never more than the room)
        head = _merge(s, spans)[0][1] + width - len(text)
        spans[0] = (0, head)
        text = _join(s, spans)
    return text


def _merge(s: str, spans: list[tuple[int, int]]) -> list[list[int]]:
    """`spans` sorted, cut to `s` and merged where they touch."""
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        b = min(b, len(s))
        if merged and a <= merged[-1][1] + 1:  # a one-character gap costs what "…" does
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _join(s: str, spans: list[tuple[int, int]]) -> str:
    """The parts of `s` in `spans`, "…" for each stretch between and after them."""
    merged = _merge(s, spans)
    out = "".join((ELLIPSIS if a > 0 else "") + s[a:b] for a, b in merged)
    return out + (ELLIPSIS if merged[-1][1] < len(s) else "")
