"""Nsight Compute CSV reader: details page (2020 / 2023 / 2025 layouts) and raw page.

What real ncu CSV files look like (all seen in shared/traces/ncu):

* ncu's stdout with ``--csv``: the application's own output and ``==PROF==`` lines come
  first, the CSV starts at the first line whose first field is ``"ID"``.
* details page, one row per (launch, section, metric). Layouts, told apart by header NAMES:
  ``details-2020`` (12 columns, a ``Kernel Time`` date, no Block/Grid/Device/CC),
  ``details-2023`` (15 columns with Block Size, Grid Size, Device, CC) and
  ``details-2025`` (20 columns, + Rule Name/Type/Description, Estimated Speedup Type,
  Estimated Speedup; metric rows stop after Metric Value plus one empty field, rule rows
  have empty metric cells). ``--nvtx`` inserts NVTX columns after Host Name.
* raw page, one row per launch: identity columns then one column per metric id, and a
  units row right under the header (its ID cell is empty).

Output: `kernels` (one per ID, times NULL), `kernel_metrics` (values in base units, see
``ncu_units``; details labels mapped to metric ids, see ``ncu_labels``), `devices`,
`kernel_rule_results` (2025 rule rows) and `launch_ranges` (the ``--nvtx`` columns, see
``ncu_nvtx``).
"""

from __future__ import annotations

import csv
import io
import itertools
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from .. import input_limits
from ..resources import Resources
from .base import ParsedTrace, TraceError, as_path
from .ncu_labels import METRIC_ID, metric_ids
from .ncu_launches import build_devices, build_kernels
from .ncu_nvtx import launch_ranges
from .ncu_units import convert, parse_ints, parse_numbers

FORMAT = "ncu-csv"
IDENTITY = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Kernel Time",
            "Context", "Stream", "Block Size", "Grid Size", "Device", "CC")
DETAILS = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
RULES = ("Rule Name", "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup")
RAW_SECTION = "raw"
LOG_PREFIXES = ("==PROF==", "==WARNING==", "==ERROR==", "==WARN==")
_WIDTH_SAMPLE_LINES = 2000
_WIDTH_SAMPLE_CHARS = 4 << 20
_BLOCK_BYTES = 16 << 20  # pyarrow needs a whole row inside one block; instanced metrics make long rows
# Room for instanced metrics (";"-joined values in one cell) and long rule texts.
csv.field_size_limit(max(csv.field_size_limit(), 1 << 28))

_HEADER = re.compile(r'^\ufeff?"?ID"?,', re.MULTILINE)
_TEXT_REPORT = re.compile(r"^\s+Section: .+$\n(?:^\s+-+[ -]*$\n)?^\s+Metric Name\s+Metric Unit\s+Metric Value",
                          re.MULTILINE)


def read(path: str | Path, *, resources: Resources | None = None) -> ParsedTrace:
    """`resources` is accepted for the readers' one signature; a CSV is read on one CPU."""
    path = as_path(path)
    text = _load_text(path)
    start = _find_header(text)
    warnings: list[str] = []
    header = _header(text, start)
    if "Kernel Name" not in header:
        raise TraceError("CSV without ncu's ID/Kernel Name header")
    is_details = all(c in header for c in DETAILS)
    if not is_details and not any(_is_metric_column(c) for c in header):
        raise TraceError("ncu CSV header has neither Section/Metric Name/Metric Value columns (details page) "
                         "nor metric-id columns (raw page)")
    metadata = {
        "page": "details" if is_details else "raw",
        "header_columns": header,
        "nvtx_columns": [c for c in header if c not in IDENTITY + DETAILS + RULES and not _is_metric_column(c)],
        "lines_before_header": text.count("\n", 0, start),
    }
    text = _drop_truncated_tail(text, start, header, is_details, warnings)
    table = _parse(text, start, header, metadata, warnings)
    if is_details:
        dialect, tables, ident = _details(header, table, metadata, warnings)
    else:
        dialect, tables, ident = _raw(header, table, metadata, warnings)
    if ident.num_rows == 0:
        raise TraceError("ncu CSV has a header but no kernel rows")
    tables["kernels"] = build_kernels(ident, tables["kernel_metrics"])
    tables["devices"] = build_devices(ident, tables["kernel_metrics"])
    ranges = launch_ranges(ident, metadata["nvtx_columns"])
    if ranges is not None:
        tables["launch_ranges"] = ranges
    hosts = pc.unique(ident["Host Name"]).to_pylist() if "Host Name" in ident.column_names else []
    metadata["hosts"] = hosts
    if "Kernel Time" in ident.column_names:
        times = ident["Kernel Time"].to_pylist()
        metadata["kernel_time_first"], metadata["kernel_time_last"] = times[0], times[-1]
    return ParsedTrace(format=FORMAT, producer="ncu", producer_version=dialect, schema_version=dialect,
                       host=hosts[0] if len(hosts) == 1 else None, clock="none",
                       metadata=metadata, tables=tables, warnings=warnings)


# -- finding the CSV --------------------------------------------------------------------

def _load_text(path: Path) -> str:
    data = path.read_bytes()
    if not data.strip():
        raise TraceError("empty file")
    if b"\x00" in data[:4096]:
        raise TraceError("binary file, not an ncu CSV export")
    return data.decode("utf-8", errors="replace")


def _find_header(text: str) -> int:
    """Offset of the `"ID",...` header line, or a TraceError saying what the file is instead."""
    id_lines = 0
    for m in _HEADER.finditer(text):  # the application's own output may print an "ID," line too
        id_lines += 1
        line_end = text.find("\n", m.start())
        if "Kernel Name" in text[m.start(): None if line_end < 0 else line_end]:
            return m.start() + (1 if text[m.start()] == "\ufeff" else 0)
    if id_lines:
        raise TraceError("CSV without ncu's ID/Kernel Name header")
    if _TEXT_REPORT.search(text):
        raise TraceError("ncu text report, not CSV: the ncu-text reader reads it")
    lines = text.splitlines()
    logs = [ln.strip() for ln in lines if ln.startswith(LOG_PREFIXES)]
    if logs:
        errors = [ln for ln in logs if ln.startswith("==ERROR==")]
        profiled = sum('Profiling "' in ln for ln in logs)
        connected = sum("Connected to process" in ln for ln in logs)
        if errors:
            why = f"the profiled application failed? ({errors[0]})"
        elif profiled:
            why = f"{profiled} kernels were profiled but neither a CSV nor a text report follows (output cut short?)"
        else:
            why = f"no kernel was profiled ({connected} processes connected)"
        raise TraceError(f"no ncu CSV header, only ==PROF== log lines: {why}")
    first = next((ln for ln in lines if ln.strip()), "")
    if "," in first:
        raise TraceError("CSV without ncu's ID/Kernel Name header")
    raise TraceError('not an ncu CSV export: no "ID","Kernel Name" header line')


def _is_metric_column(name: str) -> bool:
    # Metric ids never hold spaces or ':'; NVTX context columns always do. Most ids have
    # "__"; derived/source-counter ones (`memory_l2_theoretical_sectors_global`) do not.
    return name not in IDENTITY and METRIC_ID.match(name) is not None


# -- parsing rows --------------------------------------------------------------------------

def _header(text: str, start: int) -> list[str]:
    end = text.find("\n", start)
    line = text[start:] if end < 0 else text[start:end]
    return next(csv.reader([line.rstrip("\r")]))


def _min_fields(header: list[str], is_details: bool) -> int:
    return header.index("Metric Value") + 1 if is_details else len(header)


def _drop_truncated_tail(text: str, start: int, header: list[str], is_details: bool,
                         warnings: list[str]) -> str:
    """A file that stops mid-row (no final newline, open quote or missing cells) is refused:
    storing the rows before the cut would be a partial run that looks complete."""
    if text.endswith(("\n", "\r")):
        return text
    cut = text.rfind("\n")
    if cut < start:  # the header is the last line
        return text
    last_line = text[cut + 1:]
    if last_line.count('"') % 2 == 1 or len(next(csv.reader([last_line]), [])) < _min_fields(header, is_details):
        raise TraceError("ncu CSV ends mid-row (file truncated?)")
    return text


def _dominant_width(text: str, start: int, header: list[str]) -> int:
    """Field count of most data rows (2025 details: metric rows are shorter than the header)."""
    sample = itertools.islice(io.StringIO(text[start:start + _WIDTH_SAMPLE_CHARS]), 1, _WIDTH_SAMPLE_LINES)
    widths = Counter(len(r) for r in csv.reader(sample) if len(r) > 1)
    width = widths.most_common(1)[0][0] if widths else len(header)
    return width if width <= len(header) else len(header)


def _parse(text: str, start: int, header: list[str], metadata: dict, warnings: list[str]) -> pa.Table:
    """All data rows as string columns named after the header, plus `_nfields`.

    pyarrow reads the rows that have the common width; the rest (2025 rule rows, ncu log
    lines, junk) come back through the invalid-row handler and go through the csv module.
    Short rows are padded with "" so that every row has the header's columns.
    """
    width = _dominant_width(text, start, header)
    # A row must fit one block: room for the longest string the limits allow, twice over.
    block_bytes = min(max(_BLOCK_BYTES, 2 * input_limits.get("MAX_STRING_BYTES")), (1 << 31) - 1)
    names = [f"c{i}" for i in range(width)]
    odd: list[str] = []

    def keep_aside(row) -> str:
        odd.append(row.text)
        return "skip"

    try:
        main = pacsv.read_csv(
            io.BytesIO(text[start:].encode("utf-8")),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=block_bytes),
            parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=keep_aside),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
    except pa.ArrowInvalid as e:
        if "straddl" in str(e):  # one row longer than a whole block
            raise input_limits.over("MAX_STRING_BYTES", f"a CSV row longer than {block_bytes:,} bytes") from None
        raise TraceError(f"malformed ncu CSV: {str(e).splitlines()[0]}") from None
    rows = [next(csv.reader([t]), []) for t in odd]
    logs = [r[0] for r in rows if len(r) == 1 and r[0].startswith(LOG_PREFIXES)]
    metadata["log_lines_after_header"] = len(logs)
    warnings.extend(f"ncu log after the CSV header: {ln}" for ln in logs if ln.startswith("==ERROR=="))
    rows = [r for r in rows if not (len(r) == 1 and (r[0].startswith(LOG_PREFIXES) or not r[0].strip()))]

    n = len(header)
    columns = [main.column(i).combine_chunks() for i in range(width)]
    columns += [pa.repeat(pa.scalar(""), main.num_rows)] * (n - width)
    nfields = [pa.repeat(pa.scalar(width, pa.int64()), main.num_rows)]
    if rows:  # pad or cut to the header; _nfields keeps the true count for the callers' checks
        cells = list(itertools.zip_longest(*[r[:n] for r in rows], fillvalue=""))
        cells += [("",) * len(rows)] * (n - len(cells))
        columns = [pa.concat_arrays([c, pa.array(extra, pa.string())]) for c, extra in zip(columns, cells)]
        nfields.append(pa.array([len(r) for r in rows], pa.int64()))
    names, seen = [], set()
    for i, name in enumerate(header):  # duplicate header names keep the first spelling
        names.append(name if name not in seen else f"{name}#{i}")
        seen.add(name)
    return pa.Table.from_arrays([*columns, pa.concat_arrays(nfields)], names=[*names, "_nfields"])


def _skip_garbage(table: pa.Table, good: pa.Array, what: str, warnings: list[str]) -> pa.Table:
    bad = len(good) - pc.sum(pc.cast(good, pa.int64())).as_py() if len(good) else 0
    if bad:
        warnings.append(f"{bad} rows skipped: not ncu {what} rows (bad ID or wrong number of fields)")
    return table.filter(good)


def _identity(rows: pa.Table, metadata: dict) -> pa.Table:
    """First row of each launch ID, identity and NVTX columns only, sorted by kernel_id."""
    ids = rows["kernel_id"].to_numpy()
    _, first = np.unique(ids, return_index=True)
    cols = ["kernel_id"] + [c for c in IDENTITY if c in rows.column_names and c != "ID"] + \
        [c for c in metadata["nvtx_columns"] if c in rows.column_names]
    return rows.select(cols).take(pa.array(first))


# -- details page ---------------------------------------------------------------------------

def _dialect(header: list[str]) -> str:
    if "Rule Name" in header:
        return "details-2025"
    if "CC" in header or "Block Size" in header:
        return "details-2023"
    return "details-2020"


def _details(header: list[str], table: pa.Table, metadata: dict, warnings: list[str]):
    kernel_id = parse_ints(table["ID"].combine_chunks())
    table = table.append_column("kernel_id", kernel_id)
    has_rules = "Rule Name" in header
    rule_rows = pc.not_equal(table["Rule Name"], "") if has_rules else pa.repeat(False, table.num_rows)
    metric_rows = pc.and_(pc.greater_equal(table["_nfields"], _min_fields(header, True)),
                          pc.not_equal(table["Metric Name"], ""))
    fits = pc.less_equal(table["_nfields"], len(header))
    valid = pc.and_(pc.and_(pc.is_valid(kernel_id), fits), pc.or_(metric_rows, rule_rows))
    table = _skip_garbage(table, valid, "details", warnings)
    _warn_mixed_ids(table, warnings)

    metrics = table.filter(pc.not_equal(table["Metric Name"], ""))
    raw_values, raw_units = metrics["Metric Value"].combine_chunks(), metrics["Metric Unit"].combine_chunks()
    values, units, unknown = convert(raw_values, raw_units)
    _warn_unknown_units(unknown, warnings)
    sections, names = metrics["Section Name"].combine_chunks(), metrics["Metric Name"].combine_chunks()
    tables = {"kernel_metrics": pa.table({
        "kernel_id": metrics["kernel_id"], "section": sections, "metric_name": names,
        "metric_id": metric_ids(sections, names), "unit": units, "value": values,
        "raw_unit": raw_units, "raw_value": raw_values,
    })}
    if has_rules:
        tables["kernel_rule_results"] = _rule_results(table.filter(pc.not_equal(table["Rule Name"], "")))
    return _dialect(header), tables, _identity(table, metadata)


def _warn_mixed_ids(table: pa.Table, warnings: list[str]) -> None:
    """Concatenated exports restart IDs at 0: one ID then names two kernels."""
    if "Kernel Name" not in table.column_names or table.num_rows == 0:
        return
    names = table.group_by("kernel_id").aggregate([("Kernel Name", "count_distinct")])
    mixed = pc.sum(pc.greater(names["Kernel Name_count_distinct"], 1)).as_py() or 0
    if mixed:
        warnings.append(f"{mixed} launch IDs name more than one kernel (concatenated exports?): "
                        "kernels keeps the first name")


def _rule_results(rules: pa.Table) -> pa.Table:
    def blank_to_null(col: str) -> pa.Array:
        if col not in rules.column_names:  # a rule column missing from the header: no value
            return pa.nulls(rules.num_rows, pa.string())
        arr = rules[col].combine_chunks()
        return pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr)

    return pa.table({
        "kernel_id": rules["kernel_id"], "section": rules["Section Name"],
        "rule_name": rules["Rule Name"], "rule_type": blank_to_null("Rule Type"),
        "description": blank_to_null("Rule Description"),
        "speedup_type": blank_to_null("Estimated Speedup Type"),
        "estimated_speedup_pct": parse_numbers(blank_to_null("Estimated Speedup")),
    })


def _warn_unknown_units(unknown: list[str], warnings: list[str]) -> None:
    if unknown:
        warnings.append("units not in the unit table, values kept unconverted: " + ", ".join(unknown))


# -- raw page ---------------------------------------------------------------------------------

def _raw(header: list[str], table: pa.Table, metadata: dict, warnings: list[str]):
    units_row = [""] * len(header)
    if table.num_rows and table["ID"][0].as_py() == "":  # the units row sits right under the header
        units_row = [table.column(i)[0].as_py() for i in range(len(header))]
        table = table.slice(1)
    metadata["units_row"] = any(units_row)
    kernel_id = parse_ints(table["ID"].combine_chunks())
    valid = pc.and_(pc.is_valid(kernel_id), pc.equal(table["_nfields"], len(header)))
    table = _skip_garbage(table.append_column("kernel_id", kernel_id), valid, "raw", warnings)
    _warn_mixed_ids(table, warnings)

    metric_cols = [i for i, c in enumerate(header) if _is_metric_column(c)]
    metadata["metric_columns"] = len(metric_cols)
    launches = table.num_rows
    # Melt: column-major concatenation, so row k*launches + j is metric k of launch j.
    which = pa.array(np.repeat(np.arange(len(metric_cols), dtype=np.int64), launches))
    raw_values = pa.concat_arrays([table.column(i).combine_chunks() for i in metric_cols]) \
        if metric_cols else pa.array([], pa.string())
    names = pa.array([header[i] for i in metric_cols], pa.string()).take(which)
    raw_units = pa.array([units_row[i] for i in metric_cols], pa.string()).take(which)
    values, units, unknown = convert(raw_values, raw_units)
    _warn_unknown_units(unknown, warnings)
    kernel_ids = np.tile(table["kernel_id"].to_numpy(), len(metric_cols))
    tables = {"kernel_metrics": pa.table({
        "kernel_id": pa.array(kernel_ids, pa.int64()),
        "section": pa.repeat(pa.scalar(RAW_SECTION), len(kernel_ids)),
        "metric_name": names, "metric_id": names, "unit": units, "value": values,
        "raw_unit": raw_units, "raw_value": raw_values,
    })}
    return "raw", tables, _identity(table, metadata)
