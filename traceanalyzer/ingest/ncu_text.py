"""Nsight Compute console text report reader (format ``ncu-text``): what ``ncu ./app`` prints.

What real text reports look like (shared/traces/ncu-text, and the ``.csv``-named one in
shared/traces/ncu):

* The application's own output and ``==PROF==`` lines come first (and are skipped), then per
  process a line ``[pid] process@host``, then per profiled launch a kernel line indented two
  spaces, then its sections indented four.
* Kernel lines, two layouts: ``name (1024, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0,
  CC 8.6`` (``text-2023``: ncu 2023 and later) and ``name, 2020-Oct-28 10:36:31, Context 1,
  Stream 7`` (``text-2020``: ncu 2020-2022, no grid, block, device or CC).
* ``Section: <display name>`` then a table between dash lines. ``text-2023`` tables have a
  ``Metric Name / Metric Unit / Metric Value`` header between two dash lines; ``text-2020``
  tables have none. A table right under the kernel line with no section is the raw page.
  Columns are fixed width (the dash runs give them); units and values are right-aligned, so
  a label that overflows its column still leaves both where they belong. Numbers carry
  thousands separators in ``text-2020``.
* After the table, NVIDIA's rule results: ``OPT``/``WRN``/``INF``/``ERR`` at column 4, the
  message wrapped at column 10, an optional first line ``Est. Speedup: 50%`` or ``Est. Local
  Speedup: 19.35%``; results are separated by blank or ``----- ----`` lines. The text does
  not name the rule: it is told from the message's wording (`RULE_NAMES`), NULL when unknown.
* Files saved from a Windows shell are UTF-16 (with a byte order mark); CRLF line ends.
* ``--print-summary`` reports hold per-kernel minimum/maximum/average columns, not launches:
  refused with a message saying so.

Output: the tables the CSV reader fills (``ncu``): `kernels` (one per kernel line, numbered
in order, times NULL), `kernel_metrics` (labels mapped by ``ncu_labels``, values in base units
by ``ncu_units``), `devices`, and `kernel_rule_results`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from ..resources import Resources
from .base import ParsedTrace, TraceError, as_path
from .ncu_labels import metric_ids
from .ncu_launches import build_devices, build_kernels
from .ncu_units import convert, parse_numbers

FORMAT = "ncu-text"
RAW_SECTION = "raw"

_PROCESS = re.compile(r"^\[(?P<pid>\d+)\] (?P<process>.*)@(?P<host>[^@\s]+)$")
_KERNEL = re.compile(
    r"^  (?P<name>\S.*?)"
    r"(?: \((?P<grid>\d+, \d+, \d+)\)x\((?P<block>\d+, \d+, \d+)\))?"
    r"(?:, (?P<time>\d{4}-[A-Za-z]{3}-\d{2} \d{2}:\d{2}:\d{2}))?"
    r", Context (?P<context>\d+), Stream (?P<stream>\d+)"
    r"(?:, Device (?P<device>\d+), CC (?P<cc>\d+\.\d+))?(?P<rest>, .*)?$")
_SECTION = re.compile(r"^    Section: (?P<section>\S.*?)\s*$")
_DASHES = re.compile(r"^    -+(?: -+)*$")
_RULE = re.compile(r"^    (?P<type>OPT|WRN|INF|ERR|ERROR|WARN)  +(?P<text>\S.*)$")
_RULE_MORE = re.compile(r"^ {10}(?P<text>\S.*)$")
_SPEEDUP = re.compile(r"^Est\. (?:(?P<kind>Local|Global) )?Speedup: (?P<pct>[\d.,]+)%\s*(?P<rest>.*)$")
_TOKEN = re.compile(r"\S+")
# What tells a text report from other text: a section line (or, on the raw page, a kernel
# line) right above a table's dash line.
TEXT_REPORT = re.compile(r"^(?:    Section: \S.*|  \S.*, Context \d+, Stream \d+.*)\r?\n    -{3,}", re.MULTILINE)

# NVIDIA rule identifier <- the wording of its messages, as the CSV exports' rule rows and the
# .ncu-rep reports pair them (tests/test_ncu_text.py checks every real rule row against it). First
# match wins.
RULE_NAMES: tuple[tuple[str, re.Pattern], ...] = tuple((name, re.compile(pattern)) for name, pattern in (
    # 2023.1's one occupancy rule, before it was split into theoretical and achieved
    ("Occupancy", r"^This kernel's theoretical occupancy is not impacted by any block limit"),
    ("AchievedOccupancy", r"difference between calculated theoretical \([\d.]+%\) and measured achieved occupancy"),
    ("TheoreticalOccupancy", r"theoretical warps per scheduler this kernel can issue|"
                             r"theoretical occupancy \([\d.]+%\) is limited by"),
    ("SOLBottleneck", r"^(?:This kernel exhibits low compute throughput|Compute is more heavily utilized|"
                      r"Memory is more heavily utilized|This (?:workload|kernel) is utilizing greater than|"
                      r"The kernel is utilizing greater than|"
                      r"This kernel grid is too small to fill)"),
    ("SOLFPRoofline", r"^The ratio of peak float"),
    ("LaunchConfiguration", r"^(?:The grid for this launch is configured|A wave of thread blocks is defined|"
                            r"Threads are executed in groups of 32 threads)"),
    ("WorkloadImbalance", r"^One or more \S+(?: Slices)? have a much (?:lower|higher)"),
    ("HighPipeUtilization", r"^(?:All compute pipelines are under-utilized|\S+ is the highest-utilized pipeline)"),
    ("IssueSlotUtilization", r"^Every scheduler is capable of issuing one instruction per cycle"),
    ("CPIStall", r"^(?:On average, each warp of this kernel spends|Check the Warp Stall Sampling)"),
    ("UncoalescedGlobalAccess", r"^This kernel has uncoalesced global accesses"),
    ("MemoryCacheAccessPattern", r"^The memory access pattern for global (?:loads|stores)"),
    ("FPInstructions", r"^This kernel executes \d+ fused and \d+ non-fused"),
    ("MemoryL2Compression", r"lts__average_gcomp_input_sector_success_rate"),
))


def rule_name_of(message: str) -> str | None:
    """The NVIDIA rule a console message is the result of (`RULE_NAMES`), None when unknown."""
    return next((name for name, pattern in RULE_NAMES if pattern.search(message)), None)


@dataclass
class _Launch:
    ident: dict[str, str]
    metrics: list[tuple[str, str, str, str]] = field(default_factory=list)  # section, label, unit, value
    rules: list[dict] = field(default_factory=list)


def read(path: str | Path, *, resources: Resources | None = None) -> ParsedTrace:
    """`resources` is accepted for the readers' one signature; a text report is read on one CPU."""
    path = as_path(path)
    lines = decode(path.read_bytes()).splitlines()
    parser = _Parser()
    for number, line in enumerate(lines, 1):
        parser.line(number, line.rstrip())
    parser.finish()
    launches = parser.launches
    if not launches:
        raise TraceError("ncu text report without a kernel line (`  name ..., Context N, Stream N`)")
    layout = "text-2023" if any(k.ident["Grid Size"] for k in launches) else "text-2020"
    warnings = parser.warnings
    metrics = _metrics_table(launches, warnings)
    ident = pa.table({"kernel_id": pa.array(range(len(launches)), pa.int64()),
                      **{col: pa.array([k.ident[col] for k in launches], pa.string()) for col in _IDENT_COLUMNS}})
    tables = {"kernel_metrics": metrics, "kernels": build_kernels(ident, metrics),
              "devices": build_devices(ident, metrics)}
    rules = _rules_table(launches)
    if rules.num_rows:
        tables["kernel_rule_results"] = rules
    empty = sum(not k.metrics for k in launches)
    if empty:
        warnings.append(f"{empty} kernel lines have no metric table under them")
    sections = [len({m[0] for m in k.metrics}) for k in launches]
    if len(sections) > 1 and sections[-1] < min(sections[:-1]):  # ncu prints its sections for every launch
        warnings.append(f"the last launch has {sections[-1]} sections, every other at least {min(sections[:-1])} "
                        "(file truncated?)")
    hosts = sorted({k.ident["Host Name"] for k in launches if k.ident["Host Name"]})
    metadata = {"layout": layout, "other_lines": parser.other_lines, "hosts": hosts,
                "sections": sorted({m[0] for k in launches for m in k.metrics})}
    return ParsedTrace(format=FORMAT, producer="ncu", producer_version=layout, schema_version=layout,
                       host=hosts[0] if len(hosts) == 1 else None, clock="none",
                       metadata=metadata, tables=tables, warnings=warnings)


def decode(data: bytes) -> str:
    """The text of a report: UTF-8, or UTF-16 as a Windows shell's redirect writes it."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    head = data[:4096]
    if len(head) >= 4 and head.count(b"\x00") * 3 >= len(head):  # UTF-16 without a byte order mark
        odd_zeros = head[1::2].count(b"\x00") >= head[0::2].count(b"\x00")
        return data.decode("utf-16-le" if odd_zeros else "utf-16-be", errors="replace")
    return data.decode("utf-8-sig", errors="replace")


# -- parsing lines ------------------------------------------------------------------------

_IDENT_COLUMNS = ("Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time",
                  "Context", "Stream", "Grid Size", "Block Size", "Device", "CC")


class _Parser:
    """A line-by-line state machine. A dash line opens a table only right under a section or
    kernel line (elsewhere it separates rule results); a table's first line is its header or
    its first row; its next dash line after the rows closes it."""

    def __init__(self):
        self.launches: list[_Launch] = []
        self.warnings: list[str] = []
        self.other_lines = 0  # program output and anything else that is no part of the report
        self.process = {"Process ID": "", "Process Name": "", "Host Name": ""}
        self.section: str | None = None
        self.table_may_open = False  # the last line was a section or kernel line
        self.spans: list[tuple[int, int]] | None = None  # the open table's columns
        self.table_state = ""  # "first" (after its opening dash line), "header", "rows"
        self.table_line = 0  # line of the open table's opening dash line
        self.rule: dict | None = None
        self.bad_rows = 0

    def line(self, number: int, line: str) -> None:
        if self.spans is not None:
            self._table_line(number, line)
        elif self.rule is not None and _RULE_MORE.match(line):
            self.rule["lines"].append(line.strip())
        else:
            self._end_rule()
            self._outside(number, line)

    def finish(self) -> None:
        if self.spans is not None:
            raise TraceError(f"ncu text report ends inside the table that starts on line {self.table_line} "
                             "(file truncated?)")
        self._end_rule()
        if self.bad_rows:
            self.warnings.append(f"{self.bad_rows} table rows skipped: no label and value in them")

    def _outside(self, number: int, line: str) -> None:
        may_open, self.table_may_open = self.table_may_open, False
        if m := _KERNEL.match(line):
            self.launches.append(_Launch({**self.process, "Kernel Name": m["name"], "Kernel Time": m["time"] or "",
                                          "Context": m["context"], "Stream": m["stream"],
                                          "Grid Size": f"({m['grid']})" if m["grid"] else "",
                                          "Block Size": f"({m['block']})" if m["block"] else "",
                                          "Device": m["device"] or "", "CC": m["cc"] or ""}))
            self.section, self.table_may_open = None, True
        elif m := _PROCESS.match(line):
            self.process = {"Process ID": m["pid"], "Process Name": m["process"], "Host Name": m["host"]}
        elif m := _SECTION.match(line):
            if not self.launches:
                raise TraceError(f"ncu text report: line {number} starts a section before any kernel line")
            self.section, self.table_may_open = m["section"], True
        elif may_open and _DASHES.match(line):
            self.spans = [(t.start(), t.end()) for t in _TOKEN.finditer(line)]
            self.table_state, self.table_line = "first", number
        elif self.launches and (m := _RULE.match(line)):
            self.rule = {"type": m["type"], "lines": [m["text"].strip()], "section": self.section}
        elif line.strip() and not _DASHES.match(line):
            self.other_lines += 1

    def _table_line(self, number: int, line: str) -> None:
        if _DASHES.match(line):
            if self.table_state == "header":
                self.table_state = "rows"  # the dash line under the header
            else:
                self.spans = None  # the table's closing line
            return
        if self.table_state == "first":
            self.table_state = "rows"
            words = line.split()
            if words[:2] == ["Metric", "Name"]:
                if any(w in words for w in ("Minimum", "Maximum", "Average")):
                    raise TraceError("ncu summary report (--print-summary): it holds per-kernel minimum, maximum "
                                     "and average, not launches; print the report without --print-summary")
                self.table_state = "header"
                return
        if not line.strip() or self.table_state == "header":
            raise TraceError(f"ncu text report: the table that starts on line {self.table_line} "
                             f"breaks off at line {number} (file truncated or garbled?)")
        row = _row(line, self.spans)
        if row is None:
            self.bad_rows += 1
            return
        self.launches[-1].metrics.append((self.section or RAW_SECTION, *row))

    def _end_rule(self) -> None:
        if self.rule is None:
            return
        rule, self.rule = self.rule, None
        lines = rule["lines"]
        kind, pct = None, None
        if m := _SPEEDUP.match(lines[0]):
            kind, pct = ("local" if m["kind"] == "Local" else "global"), m["pct"]
            lines = ([m["rest"]] if m["rest"] else []) + lines[1:]
        message = " ".join(lines)
        self.launches[-1].rules.append({
            "section": rule["section"],
            "rule_name": rule_name_of(message),
            "rule_type": rule["type"], "description": message, "speedup_type": kind, "speedup": pct,
        })


def _row(line: str, spans: list[tuple[int, int]]) -> tuple[str, str, str] | None:
    """(label, unit, value) of one table row, from the columns of its dash line.

    The value is what lies in the last column (or the last word, when it is wider than its
    column); the unit is the word that ends where the unit column ends; the label the rest."""
    tokens = list(_TOKEN.finditer(line))
    if len(tokens) < 2 or len(spans) < 2:
        return None
    value_start = spans[-1][0]
    value = [t for t in tokens if t.start() >= value_start] or tokens[-1:]
    rest = tokens[: tokens.index(value[0])]
    unit = ""
    if len(spans) >= 3 and rest:
        unit_start, unit_end = spans[-2]
        if rest[-1].end() == unit_end and rest[-1].start() >= unit_start and len(rest) > 1:
            unit = rest.pop().group()
    if not rest:
        return None
    label = line[rest[0].start(): rest[-1].end()]
    return label, unit, line[value[0].start(): value[-1].end()]


# -- tables ------------------------------------------------------------------------------------

def _metrics_table(launches: list[_Launch], warnings: list[str]) -> pa.Table:
    rows = [(i, *m) for i, k in enumerate(launches) for m in k.metrics]
    kernel_ids = pa.array([r[0] for r in rows], pa.int64())
    sections, names, raw_units, raw_values = (pa.array([r[i] for r in rows], pa.string()) for i in range(1, 5))
    values, units, unknown = convert(raw_values, raw_units)
    if unknown:
        warnings.append("units not in the unit table, values kept unconverted: " + ", ".join(unknown))
    return pa.table({
        "kernel_id": kernel_ids, "section": sections, "metric_name": names,
        "metric_id": metric_ids(sections, names), "unit": units, "value": values,
        "raw_unit": raw_units, "raw_value": raw_values,
    })


def _rules_table(launches: list[_Launch]) -> pa.Table:
    rows = [(i, r) for i, k in enumerate(launches) for r in k.rules]
    col = lambda key: pa.array([r[key] for _, r in rows], pa.string())  # noqa: E731
    return pa.table({
        "kernel_id": pa.array([i for i, _ in rows], pa.int64()), "section": col("section"),
        "rule_name": col("rule_name"), "rule_type": col("rule_type"), "description": col("description"),
        "speedup_type": col("speedup_type"), "estimated_speedup_pct": parse_numbers(col("speedup")),
    })
