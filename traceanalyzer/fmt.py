"""Human-readable numbers, and trace text made safe, for terminal and report output."""

from __future__ import annotations

import re
from decimal import Decimal

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
    if isinstance(x, (list, tuple, dict)) or getattr(x, "ndim", 0):  # a list column's value
        return False
    try:
        return bool(x != x)
    except TypeError:  # pandas.NA refuses bool()
        return True


def text(x, default: str = "-") -> str:
    if getattr(x, "ndim", 0):  # a list column's value, as pandas gives it
        x = list(x)
    return default if _missing(x) or (isinstance(x, str) and x == "") else str(x)


def sig3(x: float) -> str:
    """`x` to three significant digits, never in scientific notation: 1510.4 -> '1,510',
    0.0000123 -> '0.0000123'."""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return format(Decimal(f"{x:.3g}"), "f")


def _scaled(x, units: tuple[tuple[str, float], ...], base: str) -> str:
    """`x` in the largest unit it reaches, three significant digits. Rounded first, so 999.95 us
    reads 1 ms, not 1,000 us."""
    x = float(f"{float(x):.3g}")
    for unit, scale in units:
        if abs(x) >= scale:
            return f"{sig3(x / scale)} {unit}"
    return f"{x:.0f} {base}"


def ns(x) -> str:
    """1234 -> '1.23 us'; keeps three significant digits."""
    return "-" if _missing(x) else _scaled(x, (("s", 1e9), ("ms", 1e6), ("us", 1e3)), "ns")


def window(start_ns: int, end_ns: int | None, origin_ns: int = 0, after: str = "") -> str:
    """Where a finding is, from the run's start: "at 717 ms–780 ms", or, where the two ends
    read the same at three digits, "at 122 ms for 45.2 us" (never a zero-width "122 ms–122 ms").
    `after` follows the time ("into the run"): "at 122 ms into the run, for 45.2 us"."""
    end_ns = start_ns if end_ns is None else end_ns
    a, b = ns(start_ns - origin_ns), ns(end_ns - origin_ns)
    if a != b:
        return f"at {a}–{b}{after}"
    return f"at {a}{after}" + (f"{',' if after else ''} for {ns(end_ns - start_ns)}" if end_ns > start_ns else "")


def place(start_ns: int, end_ns: int | None, origin_ns: int = 0, p=None) -> str:
    """Where a finding is, for a line of its own: its window (`window`) "into the run"; for a
    finding over many intervals, `p` its evidence's `place` (analyses/place.py, rules.evidence.Place),
    how many of them
    and how much of their time the window holds ("at 1.2 ms–3.4 ms into the run: 57 of the 127
    gaps, 61.0% of their time"), or, where it holds them all, "127 gaps between 0.5 ms and 7.5 ms
    into the run"."""
    where = window(start_ns, end_ns, origin_ns, " into the run")
    if p is None or not p.of or p.of <= 1:
        return where
    if p.count >= p.of:
        a, b = ns(start_ns - origin_ns), ns((start_ns if end_ns is None else end_ns) - origin_ns)
        return f"{p.of:,} {p.what} between {a} and {b} into the run" if a != b else where
    share = p.ns / p.total_ns if p.total_ns else None
    held = f", {pct(share)} of their time" if share is not None else ""
    return f"{where}: {p.count:,} of the {p.of:,} {p.what}{held}"


# The one phrasing of what bounds an estimated loss, said in a finding's message wherever
# something bounds it (a rule's own cap, or the diagnosis bounding it by the budget): "est. loss
# at most the 22.4 ms of kernel time that could have hidden it". Rules' SQL writes it with the
# `fmt_loss_bound(ns, what)` macro (analyses/formatting.py), built from the same text.
LOSS_BOUND = "est. loss at most the {} {}"


def loss_bound(bound_ns, what: str) -> str:
    """What bounds an estimated loss: loss_bound(22.4e6, "of kernel time that could have hidden it")."""
    return LOSS_BOUND.format(ns(bound_ns), what)


def loss_note(loss_ns) -> str:
    """' (est. loss 1.63 s)' after a finding's message (SARIF, JUnit); '' without a loss."""
    return f" (est. loss {ns(loss_ns)})" if loss_ns else ""


_BYTE_UNITS = (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3))


def related_estimate(rule_loss_ns, claims, headline: str = "the above") -> str:
    """What a related finding's own estimate is beside its headline's loss: time of the same
    budget part (its `claims`), which the diagnosis counts once, under the headline. It may be
    larger than the headline's (another threshold, or an upper bound), so it is not "part of" it:
    "its estimate 383 ms, the same idle time as the above, not added"."""
    part = str(claims).split(":")[0] if claims else None
    same = f"the same {part} time as {headline}" if part else f"the same time as {headline}"
    return f"its estimate {ns(rule_loss_ns)}, {same}, not added"


def nbytes(x) -> str:
    return "-" if _missing(x) else _scaled(x, _BYTE_UNITS, "B")


def bandwidth(bytes_per_ns) -> str:
    """Bytes per nanosecond (GB/s) in the unit that fits: 1510 -> '1.51 TB/s', 0.00229 -> '2.29 MB/s'."""
    if _missing(bytes_per_ns):
        return "-"
    return _scaled(float(bytes_per_ns) * 1e9, tuple((f"{u}/s", k) for u, k in _BYTE_UNITS), "B/s")


def pct(x) -> str:
    return "-" if _missing(x) else f"{100 * float(x):.1f}%"


def num(x) -> str:
    if _missing(x):
        return "-"
    if float(x).is_integer():
        return f"{int(x):,}"
    return sig3(float(x))


# Base names that say nothing on their own: the kernel is named by its first template argument
# (`cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>`).
_GENERIC_KERNELS = frozenset({"Kernel", "Kernel2", "kernel", "kentry", "device_kernel", "trampoline_kernel"})


def kernel_label(name, short_name=None) -> str:
    """A kernel's name for a sentence: its base name, the first template argument added when the
    base name is generic, a mangled name shortened to its last nested names."""
    name = "" if _missing(name) else str(name)
    short = name if _missing(short_name) else str(short_name)
    if short.startswith("_Z"):
        return _mangled_label(short)
    if short in _GENERIC_KERNELS and "<" in name:
        first = _first_template_argument(name)
        return f"{short}<{first}>" if first else short
    return short


def _first_template_argument(name: str) -> str:
    depth, start = 0, name.index("<") + 1
    for i in range(start, len(name)):
        c = name[i]
        if c in "<(":
            depth += 1
        elif c in ">)":
            if depth == 0:
                return _last_scope(name[start:i])
            depth -= 1
        elif c == "," and depth == 0:
            return _last_scope(name[start:i])
    return ""


def _last_scope(text: str) -> str:
    text = text.strip()
    head = text.split("<", 1)[0]
    return head.rsplit("::", 1)[-1][:80]


def _mangled_label(mangled: str) -> str:
    """`_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolution...` ->
    `cutlass_cudnn_train::Kernel<ImplicitGemmConvolution>`: the last nested name (with its scope
    and the first named type among its template arguments when it is generic). Itanium ABI:
    `_ZN` <length><name>... then `I` template arguments, `E` the end."""
    if not mangled.startswith("_ZN"):
        return mangled[:80]
    names, end = _mangled_names(mangled, 3, stop="IE")
    names = [n for n in names if not n.startswith("_GLOBAL__N")]
    if not names:
        return mangled[:80]
    if names[-1] not in _GENERIC_KERNELS:
        return names[-1]
    label = "::".join(names[-2:])
    if mangled[end:end + 1] == "I":
        inner, _ = _mangled_names(mangled, end + 1)
        typed = next((n for n in inner if len(n) >= 6 and n[0].isupper()), None)
        if typed:
            label += f"<{typed}>"
    return label


def _mangled_names(mangled: str, i: int, stop: str = "") -> tuple[list[str], int]:
    """The <length><name> tokens from `i` (up to a character of `stop` outside a name)."""
    names = []
    while i < len(mangled) and mangled[i] not in stop:
        j = i
        while j < len(mangled) and mangled[j].isdigit():
            j += 1
        if j == i:
            i += 1  # a qualifier, substitution or type code: not a name
            continue
        n = int(mangled[i:j])
        names.append(mangled[j:j + n])
        i = j + n
    return names, i


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


# Wrapping text keeps each number on one line with its unit: the space between them becomes
# GLUE (one column wide, no space to break at) for the wrap, and a space again after it.
_UNIT_SPACE = re.compile(r"(\d) (?=(?:ns|us|ms|s|B|KB|MB|GB|TB|pp)\b)")
GLUE = "\ue000"  # a character no text holds


def glue_units(text: str) -> str:
    """`text` with the space between each number and its unit made GLUE (same length)."""
    return _UNIT_SPACE.sub("\\1" + GLUE, text)


def unglue(text: str) -> str:
    return text.replace(GLUE, " ")
