"""Formatting macros: small helpers so a rule's SQL can write its own one-line message and
evidence, in the same text as `fmt`'s Python functions (tests/test_summary.py compares them)."""

from __future__ import annotations

from ..fmt import LOSS_BOUND
from ..sql import sql_literal
from .core import Macro


def _sql_format(template: str, *args: str) -> str:
    """A Python "{} ... {}" template as a SQL text expression of `args`."""
    parts = template.split("{}")
    assert len(parts) == len(args) + 1
    out = [sql_literal(parts[0])]
    for arg, part in zip(args, parts[1:]):
        out += [arg, sql_literal(part)]
    return "(" + " || ".join(out) + ")"


DEFINES = (
    # As fmt.ns and fmt.nbytes: rounded to three significant digits before the unit is chosen
    # (999.95 us reads 1 ms), never in scientific notation (15,000 s).
    Macro("fmt_sig3", "(x) AS CASE WHEN abs(x) >= 1000 THEN printf('%,.0f', x) ELSE printf('%.3g', x) END"),
    Macro("fmt_ns_rounded", """(x) AS CASE WHEN x IS NULL THEN '-'
        WHEN abs(x) >= 1e9 THEN fmt_sig3(x / 1e9) || ' s'
        WHEN abs(x) >= 1e6 THEN fmt_sig3(x / 1e6) || ' ms'
        WHEN abs(x) >= 1e3 THEN fmt_sig3(x / 1e3) || ' us'
        ELSE printf('%d ns', CAST(round(x) AS BIGINT)) END""", reads=("fmt_sig3",)),
    Macro("fmt_ns", "(x) AS fmt_ns_rounded(CAST(printf('%.3g', CAST(x AS DOUBLE)) AS DOUBLE))",
          reads=("fmt_ns_rounded",)),
    Macro("fmt_bytes_rounded", """(x) AS CASE WHEN x IS NULL THEN '-'
        WHEN abs(x) >= 1e15 THEN fmt_sig3(x / 1e15) || ' PB'
        WHEN abs(x) >= 1e12 THEN fmt_sig3(x / 1e12) || ' TB'
        WHEN abs(x) >= 1e9 THEN fmt_sig3(x / 1e9) || ' GB'
        WHEN abs(x) >= 1e6 THEN fmt_sig3(x / 1e6) || ' MB'
        WHEN abs(x) >= 1e3 THEN fmt_sig3(x / 1e3) || ' KB'
        ELSE printf('%d B', CAST(x AS BIGINT)) END""", reads=("fmt_sig3",)),
    Macro("fmt_bytes", "(x) AS fmt_bytes_rounded(CAST(printf('%.3g', CAST(x AS DOUBLE)) AS DOUBLE))",
          reads=("fmt_bytes_rounded",)),
    Macro("fmt_pct", "(x) AS CASE WHEN x IS NULL THEN '-' ELSE printf('%.1f%%', 100 * x) END"),
    # fmt.loss_bound: "est. loss at most the 22.4 ms of kernel time that could have hidden it"
    Macro("fmt_loss_bound", "(x, what) AS " + _sql_format(LOSS_BOUND, "fmt_ns(x)", "what"), reads=("fmt_ns",)),
    # "steady " before "span" where a share is of the span less its warm-up windows (what the
    # diagnosis weighs losses against), so a share is never read against the whole span.
    Macro("steady_word", "(span_ns, steady_ns) AS CASE WHEN steady_ns < span_ns THEN 'steady ' ELSE '' END"),
    # How many rows a bounded `arg_max(x, key, n)` heap keeps for a list of at most n examples:
    # at least one (the heap needs n >= 1; slice the result with [1:n] for n < 1).
    Macro("heap_size", "(n) AS CAST(greatest(floor(n), 1) AS BIGINT)"),
)
