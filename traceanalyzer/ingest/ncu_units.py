"""Nsight Compute numbers and units: human-formatted text in, base units out.

ncu prints numbers for people: thousands separators (``"4,963,609,951.19"``), ``n/a``
for metrics that do not apply, and units scaled to the "most fitting" magnitude, so one
metric can be ``usecond`` in one row and ``msecond`` in the next. Prefixes are decimal
SI (``65.54 Kbyte`` is 65 536 B rounded by ncu). Everything here is vectorized: a unit
string is resolved once per distinct value, then applied to whole columns.

Unit table (raw unit -> base unit, multiplier):

===========================================  ===============  ===========================
raw unit                                     base unit        multiplier
===========================================  ===============  ===========================
``nsecond`` ``ns``                           ``ns``           1
``usecond`` ``us``                           ``ns``           1e3
``msecond`` ``ms``                           ``ns``           1e6
``second`` ``s``                             ``ns``           1e9
``hz`` ``Khz`` ``Mhz`` ``Ghz`` (any case)    ``Hz``           1, 1e3, 1e6, 1e9
``cycle/<time>`` (``cycle/nsecond`` ...)     ``Hz``           per second (``/nsecond`` 1e9)
``<count>/<time>`` (``Gbyte/second``)        ``<count>/s``    prefix x per second
``byte`` ``Kbyte`` ``Mbyte`` ``Gbyte`` ...   ``byte``         1, 1e3, 1e6, 1e9, 1e12, 1e15
``Kibyte`` ``Mibyte`` ... (binary)           ``byte``         2**10, 2**20, ...
``Kinst`` ``Msector`` ... (any count word)   the count word   1e3, 1e6, ...
``<a>/<b>`` (``Kbyte/block``, ``inst/cycle``) ``<a>/<b>``      prefix(a) / prefix(b)
``%``                                        ``%``            1
empty                                        NULL             1
anything else                                kept as is       1 (and reported)
===========================================  ===============  ===========================

Count words: byte, bit, inst, cycle, warp, thread, block, sector, request, register, SM,
pass, cluster, sample, wavefront, transaction, lane, wave, flop. Times are ns because every
``*_ns`` column of the store is; rates are per second (``byte/s``, ``Hz``) because that is
how peaks are quoted.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TIME_TO_NS: dict[str, float] = {
    "nsecond": 1.0, "ns": 1.0,
    "usecond": 1e3, "us": 1e3,
    "msecond": 1e6, "ms": 1e6,
    "second": 1e9, "s": 1e9,
}
HERTZ: dict[str, float] = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "thz": 1e12}
SI_PREFIX: dict[str, float] = {"K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
BINARY_PREFIX: dict[str, float] = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
COUNT_WORDS = frozenset({
    "byte", "bit", "inst", "cycle", "warp", "thread", "block", "sector", "request",
    "register", "SM", "pass", "cluster", "sample", "wavefront", "transaction", "lane",
    "wave", "flop",
})

# A number as ncu prints it once the thousands separators are gone.
_NUMBER = r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$"


def _count(word: str) -> tuple[str, float] | None:
    """'Kbyte' -> ('byte', 1e3); 'inst' -> ('inst', 1); None when not a count unit."""
    if word in COUNT_WORDS:
        return word, 1.0
    for table in (BINARY_PREFIX, SI_PREFIX):
        for prefix, factor in table.items():
            if word.startswith(prefix) and word[len(prefix):] in COUNT_WORDS:
                return word[len(prefix):], factor
    return None


@lru_cache(maxsize=None)
def resolve(raw_unit: str) -> tuple[str | None, float, bool]:
    """(base unit, multiplier, known) for one raw unit string. Unknown units pass through."""
    u = raw_unit.strip()
    if not u:
        return None, 1.0, True
    if u == "%":
        return "%", 1.0, True
    if u.lower() in HERTZ:
        return "Hz", HERTZ[u.lower()], True
    if u in TIME_TO_NS:
        return "ns", TIME_TO_NS[u], True
    if "/" in u:
        num, _, den = u.partition("/")
        if "/" in den:
            return u, 1.0, False
        if den in TIME_TO_NS:  # a rate: convert to "per second"
            per_second = 1e9 / TIME_TO_NS[den]
            counted = _count(num)
            if counted is None:
                return u, 1.0, False
            base, factor = counted
            return ("Hz" if base == "cycle" else f"{base}/s"), factor * per_second, True
        n, d = _count(num) or (None, 0.0), _count(den) or (None, 0.0)
        if n[0] is None or d[0] is None:
            return u, 1.0, False
        return f"{n[0]}/{d[0]}", n[1] / d[1], True
    counted = _count(u)
    if counted is None:
        return u, 1.0, False
    return counted[0], counted[1], True


def parse_numbers(raw: pa.Array) -> pa.Array:
    """float64 of ncu-formatted text; NULL where the text is not a number (n/a, names, tuples)."""
    text = pc.replace_substring(pc.utf8_trim_whitespace(raw), ",", "")
    is_number = pc.match_substring_regex(text, _NUMBER)
    return pc.cast(pc.if_else(is_number, text, pa.scalar(None, pa.string())), pa.float64())


def parse_ints(raw: pa.Array) -> pa.Array:
    """int64 of plain integer text ("7", "1,024"); NULL otherwise."""
    text = pc.replace_substring(pc.utf8_trim_whitespace(raw), ",", "")
    is_int = pc.match_substring_regex(text, r"^[+-]?\d{1,18}$")
    return pc.cast(pc.if_else(is_int, text, pa.scalar(None, pa.string())), pa.int64())


def convert(raw_values: pa.Array, raw_units: pa.Array) -> tuple[pa.Array, pa.Array, list[str]]:
    """(values in base units, base unit strings, unknown raw units) for aligned columns."""
    values = parse_numbers(raw_values)
    distinct = pc.unique(raw_units)
    resolved = [resolve(u) for u in distinct.to_pylist()]
    where = pc.index_in(raw_units, value_set=distinct)
    units = pa.array([r[0] for r in resolved], pa.string()).take(where)
    factors = pa.array(np.array([r[1] for r in resolved], dtype=np.float64)).take(where)
    unknown = sorted(u for u, r in zip(distinct.to_pylist(), resolved) if not r[2])
    return pc.multiply(values, factors), units, unknown


_TUPLE = re.compile(r"^\((?P<x>\d+),\s*(?P<y>\d+),\s*(?P<z>\d+)\)$")


def parse_dims(raw: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """x, y, z int64 columns from ncu's "(256, 1, 1)" strings (NULL when not that shape)."""
    parts = pc.extract_regex(pc.utf8_trim_whitespace(raw), _TUPLE.pattern)
    return tuple(pc.cast(pc.struct_field(parts, k), pa.int64()) for k in ("x", "y", "z"))
