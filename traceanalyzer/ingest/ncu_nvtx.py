"""ncu `--nvtx` columns -> `launch_ranges` rows: the NVTX ranges open around each profiled launch.

ncu places its launches on no timeline, so the ranges cannot be found by time as they are for
nsys; ncu writes them out per launch instead, in one column per kind of range:

* ``thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg``: the launching
  thread's push/pop stack, the thread id then one quoted entry per range, outermost first:
  ``69459  "<default domain>:compute:none:none:none:none:none:none" ``
  (PolyFHE's exports in shared/traces/ncu; nested stacks list one quoted entry per level);
* ``Id:Domain:Start/Stop_Range:...``: the start/end ranges open at the launch, each quoted the
  same way (empty in every real export seen).

Each entry is the domain, the range text, then six payload and colour fields
(PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg). Range texts may hold colons themselves, so the
name is what lies between the domain and the last six fields; an entry with fewer fields (a
shortened export) is the domain and the rest as the name.
"""

from __future__ import annotations

import re

import pyarrow as pa

from ..schema import arrow_schema

PUSH_POP = "Push/Pop_Range"
START_END = "Start/Stop_Range"
KINDS = ((PUSH_POP, "push_pop"), (START_END, "start_end"))
PAYLOAD_FIELDS = 6  # PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg
_ENTRY = re.compile(r'"([^"]*)"')
_LEADING_ID = re.compile(r"^\s*(\d+)")
COLUMNS = ["kernel_id", "kind", "depth", "name", "domain", "tid"]


def range_kind(column: str) -> str | None:
    """`push_pop` or `start_end` for an ncu NVTX column's header, else None."""
    return next((kind for marker, kind in KINDS if marker in column), None)


def parse_entry(entry: str) -> tuple[str | None, str]:
    """(domain, name) of one quoted entry, `<default domain>:step:none:...`."""
    fields = entry.split(":")
    if len(fields) > PAYLOAD_FIELDS + 1:
        fields = fields[:-PAYLOAD_FIELDS]
    if len(fields) == 1:
        return None, fields[0].strip()
    return fields[0].strip() or None, ":".join(fields[1:]).strip()


def parse_cell(cell: str | None) -> tuple[int | None, list[tuple[str | None, str]]]:
    """The leading id (the thread, for push/pop) and the (domain, name) of each range, outermost
    first, of one ncu NVTX cell; ranges without a name are left out."""
    if not cell or not cell.strip():
        return None, []
    lead = _LEADING_ID.match(cell)
    entries = [parse_entry(e) for e in _ENTRY.findall(cell)]
    return (int(lead.group(1)) if lead else None), [(d, n) for d, n in entries if n]


def launch_ranges(identity: pa.Table, columns: list[str]) -> pa.Table | None:
    """`launch_ranges` rows from the NVTX `columns` of `identity` (one row per launch, with
    `kernel_id`); None when no launch had a range open."""
    rows: dict[str, list] = {c: [] for c in COLUMNS}
    ids = identity["kernel_id"].to_pylist()
    for column in columns:
        kind = range_kind(column)
        if kind is None or column not in identity.column_names:
            continue
        for kernel_id, cell in zip(ids, identity[column].to_pylist()):
            lead, entries = parse_cell(cell)
            for depth, (domain, name) in enumerate(entries):
                for key, value in zip(COLUMNS, (kernel_id, kind, depth, name, domain,
                                                lead if kind == "push_pop" else None)):
                    rows[key].append(value)
    if not rows["kernel_id"]:
        return None
    return pa.table(rows, schema=arrow_schema("launch_ranges", COLUMNS))
