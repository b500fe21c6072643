"""Nsight Compute report reader: the binary ``.ncu-rep`` file, read without Nsight Compute.

The container (all integers little-endian u32):

* ``NVR\\0``, the length of the file header, the file header (`FileHeader`: a version, 7 in
  every report seen);
* then blocks to the end of the file, each: the length of its block header, the block header
  (`BlockHeader`: how many source and result messages follow, the payload's size, part of the
  session details, the process, a string table), then the payload: that many messages, each
  its length then its bytes, sources first.

A block's string table adds to the strings of the blocks before it (later blocks of a report
usually have none and reuse the first's); a metric names itself by its index there. One
result message is one profiled launch (`ProfileResult`, see ``ncu_rep_proto``): names, grid,
block, context, stream, its metrics in base units, its sections and NVIDIA's rule results.

Output, as the ncu CSV reader's: `kernels` (launch ``ID`` = the result's position in the
file), `kernel_metrics` (every metric; `section`/`metric_name` are the section and label of
the details page where a section's header shows the metric, else ``raw`` and the metric id;
`unit` is told from the metric id, NULL where it cannot be), `devices` (from the
``device__attribute_*`` metrics) and `kernel_rule_results`.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pyarrow as pa
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from .. import input_limits
from ..resources import Resources
from . import ncu_rep_proto as proto
from .base import ParsedTrace, TraceError, as_path
from .ncu_launches import build_devices, build_kernels

FORMAT = "ncu-rep"
MAGIC = b"NVR\x00"
KNOWN_FILE_VERSIONS = frozenset({7})
RAW_SECTION = "raw"
MESSAGE_TYPES = {0: None, 1: "INF", 2: "WRN", 3: "ERR", 4: "OPT"}
SPEEDUP_TYPES = {1: "local", 2: "global"}
VALUE_FIELDS = ("DoubleValue", "Uint64Value", "Uint32Value", "FloatValue")
# Where the report says which Nsight Compute wrote it (the other entries: CUDA, driver, PerfWorks).
VERSION_PROVIDER = "Nsight Compute Target"

_IDENT_SCHEMA = pa.schema([("kernel_id", pa.int64())] + [(c, pa.string()) for c in (
    "Kernel Name", "mangled_name", "Grid Size", "Block Size", "Context", "Stream", "Process ID")])
# Rule texts link sections and pages; the console report prints the label (and the address).
_SECTION_LINK = re.compile(r"@section:[^:@]*:([^@]*)@")
_URL_LINK = re.compile(r"@url:([^:@]*):([^@]*)@")


def read(path: str | Path, *, resources: Resources | None = None) -> ParsedTrace:
    """`resources` is accepted for the readers' one signature; a report is read on one CPU."""
    path = as_path(path)
    input_limits.check_text_size(path.stat().st_size)  # decoded whole, like a CSV
    report = _Report()
    for kind, pos, raw, header in _messages(path.read_bytes(), report.warnings):
        if kind == "file":
            report.file_version = header.Version
        elif kind == "block":
            report.add_block(header)
        elif kind == "result":
            report.add_result(_parse(proto.ProfileResult, raw, "result message", pos))
    if not report.idents:
        raise TraceError("ncu report holds no profiled kernel launch")
    return report.trace()


# -- the container ------------------------------------------------------------------------

def _u32(data: bytes, pos: int, what: str) -> int:
    if pos + 4 > len(data):
        raise TraceError(f"ncu report truncated: the length of the {what} at byte {pos:,} is cut off")
    return struct.unpack_from("<I", data, pos)[0]


def _take(data: bytes, pos: int, size: int, what: str, end: int | None = None) -> memoryview:
    end = len(data) if end is None else end
    if pos + size > end:
        where = "the file" if end == len(data) else "its block"
        raise TraceError(f"ncu report truncated or corrupt: the {what} at byte {pos:,} needs {size:,} bytes, "
                         f"{where} has {end - pos:,} left")
    return memoryview(data)[pos:pos + size]


def _parse(cls, raw, what: str, pos: int):
    msg = cls()
    try:
        msg.ParseFromString(raw)
    except DecodeError:
        raise TraceError(f"corrupt ncu report: the {what} at byte {pos:,} is no valid protobuf message") from None
    return msg


def _messages(data: bytes, warnings: list[str]):
    """("file", 8, None, FileHeader), then ("block", pos, None, BlockHeader) and
    ("source"/"result", pos, bytes, None) in file order."""
    if not data.startswith(MAGIC):
        raise TraceError("not an Nsight Compute report: no NVR magic")
    size = _u32(data, 4, "file header")
    header = _parse(proto.FileHeader, _take(data, 8, size, "file header"), "file header", 8)
    if header.Version not in KNOWN_FILE_VERSIONS:
        warnings.append(f"ncu report file version {header.Version} (this reader knows "
                        f"{', '.join(map(str, sorted(KNOWN_FILE_VERSIONS)))}): read as far as it is known")
    yield "file", 8, None, header
    pos = 8 + size
    while pos < len(data):
        size = _u32(data, pos, "block header")
        block = _parse(proto.BlockHeader, _take(data, pos + 4, size, "block header"), "block header", pos + 4)
        pos += 4 + size
        end = pos + block.PayloadSize
        _take(data, pos, block.PayloadSize, "block payload")
        count = block.NumSources + block.NumResults
        if count * 4 > block.PayloadSize:
            raise TraceError(f"corrupt ncu report: the block at byte {pos:,} says it holds {count:,} messages "
                             f"in {block.PayloadSize:,} bytes")
        yield "block", pos, None, block
        for i in range(count):
            kind = "source" if i < block.NumSources else "result"
            size = _u32(data, pos, f"{kind} message")
            yield kind, pos + 4, _take(data, pos + 4, size, f"{kind} message", end), None
            pos += 4 + size
        if pos != end:
            warnings.append(f"ncu report: {end - pos:,} bytes after the messages of the block ending at byte "
                            f"{end:,} skipped")
            pos = end


# -- results -> rows ---------------------------------------------------------------------

def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _dims(xyz) -> str | None:
    return f"({xyz.X}, {xyz.Y}, {xyz.Z})" if xyz.ByteSize() else None


def _value(v) -> tuple[float | None, str | None]:
    """(number, text) of one metric value."""
    for name in VALUE_FIELDS:
        if v.HasField(name):
            x = getattr(v, name)
            return float(x), repr(x)
    if v.HasField("StringValue"):
        return None, _text(v.StringValue)
    return None, None


def rule_text(raw: bytes) -> str:
    """A rule message as the console report prints it: links become their labels."""
    text = _SECTION_LINK.sub(r"\1", _text(raw))
    return _URL_LINK.sub(r"\1 (\2)", text)


# Launch metrics whose unit the id does not tell (the console report's units).
_LAUNCH_UNITS = {"launch__registers_per_thread": "register/thread", "launch__thread_count": "thread",
                 "launch__occupancy_limit_": "block", "launch__shared_mem_per_block": "byte/block",
                 "launch__shared_mem_config_size": "byte"}
# Counter words -> unit, first match wins.
_COUNT_UNITS = (("cycles", "cycle"), ("bytes", "byte"), ("sectors", "sector"), ("requests", "request"),
                ("inst_executed", "inst"), ("inst_issued", "inst"), ("warps", "warp"), ("threads", "thread"))


def unit_of(metric_id: str) -> str | None:
    """The base unit of a metric, told from its id (a report stores values, not units); None
    when the id does not tell."""
    counter, _, last = metric_id.rpartition(".") if "." in metric_id else (metric_id, "", "")
    if metric_id.endswith("pct") or ".pct_of_peak" in metric_id:
        return "%"
    if "__time_" in metric_id:
        return "ns"
    if metric_id.startswith("launch__"):
        return next((u for prefix, u in _LAUNCH_UNITS.items() if metric_id.startswith(prefix)), None)
    if last == "ratio" or metric_id.startswith("device__attribute_"):
        return None
    for word, unit in _COUNT_UNITS:
        if word in counter:
            if last == "per_second":
                return "Hz" if unit == "cycle" else f"{unit}/s"
            return None if "per_" in last else unit
    return None


class _Report:
    """What the messages of one report add up to."""

    def __init__(self):
        self.file_version: int | None = None
        self.strings: list[str] = []
        self.process = None
        self.versions: dict[str, str] = {}
        self.target: dict[str, str] = {}
        self.idents: list[dict] = []
        self.metrics: dict[str, list] = {k: [] for k in (
            "kernel_id", "section", "metric_name", "metric_id", "unit", "value", "raw_value")}
        self.rules: list[dict] = []
        self.warnings: list[str] = []
        self.unknown: set[str] = set()
        self.bad_name_ids = 0
        self._units: dict[str, str | None] = {}

    def _note_unknown(self, msg, name: str) -> None:
        for f in UnknownFieldSet(msg):
            if f.field_number not in proto.KNOWN_FIELDS[name]:
                self.unknown.add(f"{name}.{f.field_number}")

    def add_block(self, block) -> None:
        self._note_unknown(block, "BlockHeader")
        self.strings.extend(_text(s) for s in block.StringTable.Strings)
        if block.HasField("Process"):
            self.process = block.Process
        if block.HasField("SessionDetails"):
            session = block.SessionDetails
            self._note_unknown(session, "SessionDetails")
            for v in session.VersionInfo:
                self.versions[_text(v.Provider)] = _text(v.Version)
            if session.HasField("TargetSystemInfo"):
                t = session.TargetSystemInfo
                self.target.update({k: _text(getattr(t, k)) for k in ("OSName", "Processor", "ComputerName")
                                    if t.HasField(k)})

    def add_result(self, r) -> None:
        self._note_unknown(r, "ProfileResult")
        kernel_id = len(self.idents)
        names = [_text(getattr(r, f)) for f in ("KernelDemangledName", "KernelFunctionName", "KernelMangledName")
                 if r.HasField(f)]
        self.idents.append({
            "kernel_id": kernel_id, "Kernel Name": names[0] if names else None,
            "mangled_name": _text(r.KernelMangledName) if r.HasField("KernelMangledName") else None,
            "Grid Size": _dims(r.GlobalWorkSize), "Block Size": _dims(r.LocalWorkSize),
            "Context": str(r.ContextID) if r.HasField("ContextID") else None,
            "Stream": str(r.StreamID) if r.HasField("StreamID") else None,
            "Process ID": str(self.process.ProcessID) if self.process is not None else None,
        })
        sections = {_text(s.Identifier): _text(s.DisplayName) for s in r.Sections}
        shown = {}
        for s in r.Sections:  # the first section showing a metric in its header names it
            for m in s.Header.Metrics:
                shown.setdefault(_text(m.Name), (_text(s.DisplayName), _text(m.Label) or _text(m.Name)))
        self._add_metrics(kernel_id, r.MetricResults, shown)
        self._add_rules(kernel_id, r.RuleResults, sections)

    def _add_metrics(self, kernel_id: int, results, shown: dict) -> None:
        m = self.metrics
        for result in results:
            if result.NameId >= len(self.strings):
                self.bad_name_ids += 1
                continue
            metric_id = self.strings[result.NameId]
            value, text = _value(result.MetricValue)
            if text is None and result.MetricValueList:  # an instanced metric: its values, as ncu's CSV joins them
                text = ";".join(_value(e.ElementValue)[1] or "" for e in result.MetricValueList)
            elif text is None and UnknownFieldSet(result.MetricValue):
                self.unknown.add("MetricValue." + ",".join(
                    sorted({str(f.field_number) for f in UnknownFieldSet(result.MetricValue)})))
            section, label = shown.get(metric_id, (RAW_SECTION, metric_id))
            if metric_id not in self._units:
                self._units[metric_id] = unit_of(metric_id)
            m["kernel_id"].append(kernel_id)
            m["section"].append(section)
            m["metric_name"].append(label)
            m["metric_id"].append(metric_id)
            m["unit"].append(self._units[metric_id])
            m["value"].append(value)
            m["raw_value"].append(text)

    def _add_rules(self, kernel_id: int, results, sections: dict) -> None:
        for rule in results:
            section_id = _text(rule.SectionIdentifier)
            for item in rule.Body.Items:
                if not item.HasField("Message"):
                    continue  # a table or chart of the rule, not a message
                speedup = item.Speedup if item.HasField("Speedup") else None
                self.rules.append({
                    "kernel_id": kernel_id, "section": sections.get(section_id, section_id or None),
                    "rule_name": _text(rule.Identifier),
                    "rule_type": MESSAGE_TYPES.get(item.Message.Type, str(item.Message.Type)),
                    "description": rule_text(item.Message.Message),
                    "speedup_type": SPEEDUP_TYPES.get(speedup.Type) if speedup else None,
                    "estimated_speedup_pct": speedup.Value if speedup and speedup.HasField("Value") else None,
                })

    def trace(self) -> ParsedTrace:
        if self.bad_name_ids:
            self.warnings.append(f"{self.bad_name_ids:,} metric values name a string past the report's "
                                 "string table: skipped")
        if self.unknown:
            self.warnings.append("ncu report fields this reader does not know were skipped (a newer Nsight "
                                 "Compute?): " + ", ".join(sorted(self.unknown)))
        ident = pa.Table.from_pylist(self.idents, schema=_IDENT_SCHEMA)
        m = self.metrics
        metrics = pa.table({
            "kernel_id": pa.array(m["kernel_id"], pa.int64()), "section": pa.array(m["section"], pa.string()),
            "metric_name": pa.array(m["metric_name"], pa.string()),
            "metric_id": pa.array(m["metric_id"], pa.string()), "unit": pa.array(m["unit"], pa.string()),
            "value": pa.array(m["value"], pa.float64()),
            "raw_unit": pa.nulls(len(m["kernel_id"]), pa.string()),
            "raw_value": pa.array(m["raw_value"], pa.string()),
        })
        kernels = build_kernels(ident, metrics).append_column("mangled_name", ident["mangled_name"])
        tables = {"kernels": kernels, "kernel_metrics": metrics, "devices": build_devices(ident, metrics)}
        if self.rules:
            tables["kernel_rule_results"] = pa.Table.from_pylist(self.rules, schema=pa.schema([
                ("kernel_id", pa.int64()), ("section", pa.string()), ("rule_name", pa.string()),
                ("rule_type", pa.string()), ("description", pa.string()), ("speedup_type", pa.string()),
                ("estimated_speedup_pct", pa.float64())]))
        version = self.versions.get(VERSION_PROVIDER, "").split(" ")[0] or None
        process = self.process
        host = _text(process.Hostname) if process is not None and process.HasField("Hostname") else None
        metadata = {"ncu_versions": self.versions, "target_system": self.target, "launches": len(self.idents),
                    "process_name": _text(process.ProcessName) if process is not None else None}
        return ParsedTrace(format=FORMAT, producer="ncu", producer_version=version,
                           schema_version=f"ncu-rep v{self.file_version}", host=host, clock="none",
                           metadata=metadata, tables=tables, warnings=self.warnings)
