"""The evidence a finding carries, as types: each rule declares a `msgspec.Struct` for the JSON
its query writes (`Rule.evidence`), and readers decode it with `evidence_of`.

A rule's Struct is a declaration and a reader, never a writer: the rules still write the JSON
text they write, and the Struct must decode every finding they store, unknown keys forbidden
(tests/test_rule_cases.py decodes every case's findings, tests/test_evidence.py the real corpus's).
So a key renamed in a rule's query fails that test, and a field renamed in a Struct fails the
report code that reads it, instead of blanking a report.

The bases hold the keys that shared steps add to any rule's evidence: the diagnosis (warm-up
and per-step figures, traceanalyzer.diagnosis), abstention (`cause: unknown`, rules/_unknown.py),
a finding's own severity cap, the operator that launched a kernel (rules/_code.py) and the
timeline facts of a kernel seen in Nsight Compute (rules/_ncu.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import msgspec


def doc(text: str) -> msgspec.Meta:
    """A field's one-line meaning, shown on its rule's page (rules/docs.py)."""
    return msgspec.Meta(description=text)


class Evidence(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Keys any finding may carry besides its rule's own."""

    severity_reason: Annotated[Optional[str], doc("why this finding is less severe than its loss says")] = None
    cause: Annotated[Optional[str], doc("`unknown` where the trace cannot tell the cause the rule names")] = None
    missing: Annotated[Optional[list[str]], doc("what the trace lacks to tell the cause, and how to record it")] = None
    loss_warmup_ns: Annotated[Optional[int], doc("the diagnosis: time of the loss inside warm-up windows, not counted")] = None
    loss_per_step_ns: Annotated[Optional[int], doc("the diagnosis: the estimated loss divided by the steady steps")] = None
    loss_steps: Annotated[Optional[int], doc("the diagnosis: steady steps the loss is spread over")] = None


class TimeRange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """An example with a time range: reports draw it on the timeline and zoom to it
    (`ranges_in`). omit_defaults: written back out (a Chrome trace's arguments), an example
    leaves out the keys its rule did not write."""

    start_ns: Annotated[int, doc("start, trace clock")]
    end_ns: Annotated[int, doc("end, trace clock")]


class StreamRange(TimeRange, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """An example with a time range on one stream: drawn on that stream's track."""

    stream_id: Annotated[Optional[int], doc("the stream")] = None


class Place(TimeRange, kw_only=True, forbid_unknown_fields=True):
    """Where most of a finding's intervals lie (analyses/place.py)."""

    count: Annotated[int, doc("intervals inside the window")]
    of: Annotated[int, doc("intervals in all")]
    ns: Annotated[int, doc("their time inside the window")]
    total_ns: Annotated[int, doc("their time in all")]
    what: Annotated[str, doc("what the intervals are, plural")]


class Compiled(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A TorchInductor kernel: what its name and Inductor's launcher say of it (rules/_code.py)."""

    generator: Annotated[str, doc("the compiler that generated the kernel")]
    class_: Annotated[str, doc("Inductor's kernel class (pointwise, reduction, ...)")] = msgspec.field(name="class")
    fused_ops: Annotated[list[str], doc("the operators fused into it, from its name")]
    kernel_file: Annotated[Optional[str], doc("the generated source file")] = None
    kernel_hash: Annotated[Optional[str], doc("the generated kernel's hash")] = None
    kernel_kwargs: Annotated[Optional[str], doc("its launch arguments")] = None
    num_warps: Annotated[Optional[int], doc("warps per block")] = None
    num_stages: Annotated[Optional[int], doc("software pipeline stages")] = None
    graphs: Annotated[Optional[list[str]], doc("the compiled graphs (CompiledFxGraph hashes) it ran in")] = None
    regions: Annotated[Optional[list[str]], doc("the compiled regions it ran in")] = None


class AllocationCall(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One call of user code that allocated at a site (rules/_memory.py)."""

    bytes: Annotated[int, doc("bytes")]
    call: Annotated[str, doc("the call (user frame) that allocated")]


class AllocationSite(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where memory held at a moment was allocated, by user code (rules/_memory.py: M003, M004)."""

    allocations: Annotated[int, doc("allocations counted")]
    bytes: Annotated[int, doc("bytes")]
    calls: Annotated[list[AllocationCall], doc("the calls that allocated most of it")]
    share: Annotated[float, doc("share of the total")]
    site: Annotated[str, doc("the allocation site (user code)")]
    user_frames: Annotated[list[str], doc("the user code's stack frames")]
    via: Annotated[Optional[str], doc("the library call the user code made")]


class PlacedEvidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    """A finding over many intervals (gaps, copies, stretches)."""

    place: Annotated[Optional[Place], doc("where most of the intervals lie")] = None


class KernelEvidence(Evidence, kw_only=True, forbid_unknown_fields=True):
    """A finding on a kernel: the operator or range that launched most of its time."""

    launched_by: Annotated[Optional[str], doc("the operator or range that launched most of the kernel's time")] = None
    launched_by_share: Annotated[Optional[float], doc("share of the kernel's time launched there")] = None
    compiled: Annotated[Optional[Compiled], doc("what the compiler says of a generated kernel")] = None


class NcuEvidence(KernelEvidence, kw_only=True, forbid_unknown_fields=True):
    """A finding from Nsight Compute metrics; on a timeline linked to them, the timeline's facts."""

    timeline_run_id: Annotated[Optional[str], doc("the linked timeline run")] = None
    ncu_run_id: Annotated[Optional[str], doc("the Nsight Compute run the finding comes from")] = None
    ncu_run_ids: Annotated[Optional[list[str]], doc("the Nsight Compute runs linked to the timeline")] = None
    ncu_item_id: Annotated[Optional[int], doc("the kernel's id in the Nsight Compute run")] = None
    ncu_kernel_name: Annotated[Optional[str], doc("the kernel's name in the Nsight Compute run")] = None
    kernel_time_ns: Annotated[Optional[int], doc("the kernel's time in the timeline (matched launches)")] = None
    kernel_share: Annotated[Optional[float], doc("that time's share of the timeline's kernel time")] = None
    timeline_launches: Annotated[Optional[int], doc("the kernel's matched launches in the timeline")] = None
    ncu_time_ns: Annotated[Optional[float], doc("the kernel's profiled time in Nsight Compute")] = None
    loss_share: Annotated[Optional[float], doc("the rule's loss as a share of the profiled time")] = None
    ncu_est_loss_ns: Annotated[Optional[float], doc("the rule's loss in the Nsight Compute run")] = None


class NcuTimedEvidence(NcuEvidence, kw_only=True, forbid_unknown_fields=True):
    """A finding from Nsight Compute metrics that says the kernel's profiled time."""

    duration_ns: Annotated[Optional[float], doc("the kernel's profiled time, all its launches")]


def ranges_in(evidence) -> list[TimeRange]:
    """The examples with a time range that decoded evidence lists (`worst`, `place`), in the
    order of its fields."""
    out: list[TimeRange] = []
    _ranges(evidence, out)
    return out


def _ranges(v, out: list) -> None:
    if isinstance(v, TimeRange) and v.start_ns is not None and v.end_ns is not None:
        out.append(v)
    if isinstance(v, msgspec.Struct):
        for name in v.__struct_fields__:
            x = getattr(v, name)
            if isinstance(x, (msgspec.Struct, list)):
                _ranges(x, out)
    elif isinstance(v, list):
        for x in v:
            _ranges(x, out)


def decode(text: str | bytes | None, kind: type[Evidence], strict: bool = True) -> Any:
    """`text` (a finding's stored evidence) as `kind`; None for no evidence. Raises
    msgspec.ValidationError where the text does not fit the type."""
    if text is None or text == "":
        return None
    try:
        return msgspec.json.decode(text, type=kind, strict=strict)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError:
        # Python's json writes NaN for a missing float (B001's sm_count, B002's blocks_per_sm);
        # JSON has no such number, so msgspec's parser refuses the text that json.loads reads.
        return msgspec.convert(json.loads(text), type=kind, strict=strict)


def own_fields(kind: type) -> set[str]:
    """The fields a rule's Struct declares itself, not those of the shared bases here."""
    base = next(c for c in kind.__mro__ if c.__module__ == __name__)
    mine = set()
    for c in kind.__mro__:
        if c is base:
            break
        mine |= set(getattr(c, "__annotations__", {}))
    return mine | (set(kind.__struct_fields__) - set(base.__struct_fields__))


def fields(kind: type) -> list[tuple[str, str, str]]:
    """(name, type, meaning) of each field of a Struct, nested Structs' fields as `parent.child`
    (`[]` after a list of them), for the rule's doc page."""
    out: list[tuple[str, str, str]] = []
    _walk(kind, "", out, set())
    return out


def _walk(kind: type, prefix: str, out: list, seen: set) -> None:
    info = msgspec.inspect.type_info(kind)
    for f in info.fields:
        meaning = ""
        t = f.type
        if isinstance(t, msgspec.inspect.Metadata):
            meaning = (t.extra_json_schema or {}).get("description", "")
            t = t.type
        name = prefix + f.encode_name
        out.append((name, _type_name(t), meaning))
        inner, suffix = _struct_in(t)
        if inner is not None and inner.cls not in seen:
            _walk(inner.cls, name + suffix + ".", out, seen | {inner.cls})


def _struct_in(t) -> tuple[Any, str]:
    i = msgspec.inspect
    if isinstance(t, i.Metadata):
        t = t.type
    if isinstance(t, i.UnionType):
        t = next((x for x in t.types if not isinstance(x, i.NoneType)), t)
    if isinstance(t, i.StructType):
        return t, ""
    if isinstance(t, (i.ListType, i.TupleType, i.VarTupleType)) and isinstance(getattr(t, "item_type", None), i.StructType):
        return t.item_type, "[]"
    if isinstance(t, i.DictType) and isinstance(t.value_type, i.StructType):
        return t.value_type, "{}"
    return None, ""


def _type_name(t) -> str:
    i = msgspec.inspect
    if isinstance(t, i.Metadata):
        return _type_name(t.type)
    if isinstance(t, i.UnionType):
        names = [_type_name(x) for x in t.types if not isinstance(x, i.NoneType)]
        optional = any(isinstance(x, i.NoneType) for x in t.types)
        return " or ".join(names) + (" or null" if optional else "")
    if isinstance(t, i.ListType):
        return f"list[{_type_name(t.item_type)}]"
    if isinstance(t, i.DictType):
        return f"map[{_type_name(t.key_type)}, {_type_name(t.value_type)}]"
    if isinstance(t, i.StructType):
        return "object"
    names = {i.IntType: "int", i.FloatType: "float", i.StrType: "str", i.BoolType: "bool", i.AnyType: "any",
             i.NoneType: "null"}
    return names.get(type(t), type(t).__name__.removesuffix("Type").lower())
