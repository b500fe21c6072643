"""Human-readable numbers, and trace text made safe, for terminal and report output."""

from __future__ import annotations

import re

# Control characters (ANSI escapes, newlines) and bidi overrides can rewrite a terminal or
# reorder a line; trace text (kernel names, file names) shows them escaped instead.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text) -> str:
    """Trace-derived text with control and bidi characters shown as escapes (\\x1b)."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], "" if text is None else str(text))



def _missing(x) -> bool:
    """None, NaN, pandas NA/NaT."""
    if x is None:
        return True
    try:
        return bool(x != x)
    except TypeError:  # pandas.NA refuses bool()
        return True


def text(x, default: str = "-") -> str:
    return default if _missing(x) or x == "" else str(x)


def ns(x) -> str:
    """1234 -> '1.23 us'; keeps three significant digits."""
    if _missing(x):
        return "-"
    x = float(f"{float(x):.3g}")  # round first, so 999.95 us reads 1 ms, not 1e+03 us
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} ns"


def nbytes(x) -> str:
    if _missing(x):
        return "-"
    x = float(f"{float(x):.3g}")
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def pct(x) -> str:
    return "-" if _missing(x) else f"{100 * float(x):.1f}%"


def num(x) -> str:
    if _missing(x):
        return "-"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{float(x):.3g}"
