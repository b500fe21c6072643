"""Typed shapes of Kineto trace events, and the category alias table.

Events are decoded with msgspec into small Structs whose `args` stays a `msgspec.Raw`
slice of the input: most events (python_function, flows, metadata) never need their
args, and the ones that do are decoded per category, one batch per chunk of the file,
into a Struct holding only the fields that category uses. Unknown keys are skipped by msgspec without building
Python objects, which is where the time and memory go with a generic decoder (see the
measurements at the top of `kineto.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Raw, Struct, field

# Every integer must fit the int64 columns it ends up in; a bigger one fails validation
# like a wrong type does (the event is skipped, or the file refused for top-level fields).
Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
NO_ARGS = Raw(b"{}")
NO_RAW = Raw(b"")


class Event(Struct, gc=False):
    """One entry of `traceEvents`. Every field may be absent; the reader checks what
    each category needs and skips (and counts) events that lack it."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: Int | str | None = None
    tid: Int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: Raw = NO_ARGS


# Kineto writes `External id` since late 2021 and `external id` before (§4.3).
def _ext() -> Any:
    return field(default=None, name="External id")


def _ext_legacy() -> Any:
    return field(default=None, name="external id")


class KernelArgs(Struct, gc=False):
    external_id: Int | None = _ext()
    external_id_legacy: Int | None = _ext_legacy()
    device: Int | None = None
    context: Int | None = None
    stream: Int | None = None
    correlation: Int | None = None
    registers_per_thread: Int | None = field(default=None, name="registers per thread")
    # Kineto writes static + dynamic shared memory as one number (output_json.cpp).
    shared_memory_bytes: Int | None = field(default=None, name="shared memory")
    blocks_per_sm: float | None = field(default=None, name="blocks per SM")
    est_occupancy_pct: float | None = field(default=None, name="est. achieved occupancy %")
    # The same field before its May-2021 rename.
    theoretical_occupancy_pct: float | None = field(default=None, name="theoretical occupancy %")
    grid: list[Int] | None = None
    block: list[Int] | None = None
    graph_id: Int | None = field(default=None, name="graph id")


class CallArgs(Struct, gc=False):
    """cuda_runtime / cuda_driver (and ROCm's hip* calls, which share the category)."""

    external_id: Int | None = _ext()
    external_id_legacy: Int | None = _ext_legacy()
    correlation: Int | None = None
    # ROCm puts the launch geometry and copy size on the runtime call, not the activity.
    grid: list[Int] | None = None
    block: list[Int] | None = None
    shared_memory_bytes: Int | None = field(default=None, name="shared memory")
    size: Int | str | None = None


class CopyArgs(Struct, gc=False):
    """gpu_memcpy and gpu_memset."""

    external_id: Int | None = _ext()
    external_id_legacy: Int | None = _ext_legacy()
    device: Int | None = None
    context: Int | None = None
    stream: Int | None = None
    correlation: Int | None = None
    bytes: Int | None = None
    from_device: Int | None = field(default=None, name="fromDevice")
    to_device: Int | None = field(default=None, name="toDevice")


class SyncArgs(Struct, gc=False):
    external_id: Int | None = _ext()
    cuda_sync_kind: str | None = None
    device: Int | None = None
    context: Int | None = None
    stream: Int | None = None
    correlation: Int | None = None


class CpuOpArgs(Struct, gc=False):
    external_id: Int | None = _ext()
    external_id_legacy: Int | None = _ext_legacy()
    sequence_number: Int | None = field(default=None, name="Sequence number")
    # Kept as the file's JSON text: the schema stores it as JSON text anyway.
    input_dims: Raw = field(default=NO_RAW, name="Input Dims")
    input_dims_legacy: Raw = field(default=NO_RAW, name="Input dims")
    input_types: Raw = field(default=NO_RAW, name="Input type")
    concrete_inputs: Raw = field(default=NO_RAW, name="Concrete Inputs")
    # What TorchInductor's launcher records on the operator that launches a compiled kernel
    # (torch/_inductor/runtime/triton_heuristics.py, `get_profiler_kwargs`), kept as JSON text.
    kernel_backend: Raw = NO_RAW
    kernel_name: Raw = NO_RAW
    kernel_file: Raw = NO_RAW
    kernel_hash: Raw = NO_RAW
    kernel_kwargs: Raw = NO_RAW
    num_warps: Raw = NO_RAW
    num_stages: Raw = NO_RAW
    grid: Raw = NO_RAW


# The CpuOpArgs fields that make `cpu_ops.kernel_meta`, by the key they have there.
KERNEL_META_FIELDS = ("kernel_backend", "kernel_name", "kernel_file", "kernel_hash", "kernel_kwargs", "num_warps",
                      "num_stages", "grid")


class MemoryArgs(Struct, gc=False):
    device_type: Int | None = field(default=None, name="Device Type")
    device_id: Int | None = field(default=None, name="Device Id")
    addr: Int | None = field(default=None, name="Addr")
    bytes: Int | None = field(default=None, name="Bytes")
    total_allocated: Int | None = field(default=None, name="Total Allocated")
    total_reserved: Int | None = field(default=None, name="Total Reserved")


# Lower-cased `cat` -> the role the reader gives it. Covers every era in §4.3 (legacy
# capitalised names, `gpu_user_Annotation`) because matching is case-insensitive.
CATEGORY_ROLES: dict[str, str] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "driver",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
    "mtia_runtime": "mtia",
    "mtia_ccp_events": "mtia",
}
MEMORY_EVENT_NAME = "[memory]"
MEMORY_EVENT_CATEGORY = "cpu_instant_event"  # absent (no `cat`) in 2021 traces


def role_of(cat: str | None) -> str | None:
    return CATEGORY_ROLES.get(cat.lower()) if cat else None


S = TypeVar("S", bound=Struct)


def decode_args(events: list[Event], shape: type[S]) -> list[S | None]:
    """Decode the args of `events` into `shape`, one batch for all of them.

    A value of the wrong type inside args makes that one event unusable, not the file:
    on a batch failure each event is decoded alone and the bad ones come back as None
    (the caller counts them, once it knows which events it keeps)."""
    raws = [e.args for e in events]
    try:
        return msgspec.json.decode(b"[" + b",".join(raws) + b"]", type=list[shape])
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    out: list[S | None] = []
    for raw in raws:
        if bytes(raw).strip() == b"null":  # `"args": null` means no args, not bad args
            out.append(shape())
            continue
        try:
            out.append(msgspec.json.decode(raw, type=shape))
        except (msgspec.ValidationError, msgspec.DecodeError):
            out.append(None)
    return out
