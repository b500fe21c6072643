"""Human-readable numbers for terminal and report output."""

from __future__ import annotations


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
