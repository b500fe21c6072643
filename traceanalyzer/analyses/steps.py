"""Iterations on the host: the step ranges (`steps`)."""

from __future__ import annotations

from .core import View


# A Kineto profiler step's range name.
PROFILER_STEP = r"^ProfilerStep#\d+$"


DEFINES = (
    View(
        "steps",
        "Per run, the iteration ranges on the host: Kineto `ProfilerStep#N` when the run has them, else "
        "NVTX or user annotations named like a step or iteration (`step`, `iter`, `iteration` as a word). "
        "The GPU-side copies Kineto also writes (`gpu_user_annotation`) are not steps of their own.",
        # Names are matched once each, not once per range (24 M NVTX ranges: 0.5 s, against 3-4 s);
        # an inner join and a window by run, not a semi join and a subquery, so that a filter
        # on the run reaches both scans of `ranges`.
        f"""
        WITH names AS (
            SELECT run_id, name, regexp_matches(name, '{PROFILER_STEP}') AS profiler_step,
                   regexp_matches(name, '(?i)(^|[^a-z])(step|iteration|iter)([^a-z]|$)') AS step_like
            FROM (SELECT DISTINCT run_id, name FROM ranges)
        ), step_names AS (  -- one (run, name) each
            SELECT run_id, name FROM (
                SELECT *, bool_or(profiler_step) OVER (PARTITION BY run_id) AS run_has_profiler_steps FROM names)
            WHERE profiler_step OR (step_like AND NOT run_has_profiler_steps)
        )
        SELECT r.run_id, r.range_id, r.name, r.start_ns, r.end_ns FROM ranges r
        JOIN step_names s ON s.run_id = r.run_id AND s.name = r.name
        WHERE r.kind IN ('user_annotation', 'nvtx') AND r.end_ns > r.start_ns
        """,
        reads=(),
    ),
)
