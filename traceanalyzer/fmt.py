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
