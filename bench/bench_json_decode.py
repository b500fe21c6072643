"""How to decode a big Kineto trace: time and peak memory of the candidate JSON decoders.

Replicates the events of a real trace until the file is about --mb megabytes (in a temp
dir), then runs each decoder in a fresh subprocess so that peak RSS (VmHWM) is its
own. Prints seconds, MB/s, speed relative to the first method, and the peak RSS the
decode added (reading the file's bytes included), also as a ratio to the file size.
No asserts: this informs the choice written at the top of `traceanalyzer/ingest/kineto.py`.

    python bench/bench_json_decode.py [--mb 100] [--source PATH] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = (
    ROOT.parent / "shared" / "traces" / "torch"
    / "TraceLens__h100__google_owlv2-large-patch14-ensemble__1016001.json.gz"
)
METHODS = (
    "json", "orjson", "msgspec-untyped", "msgspec-typed-fullargs", "msgspec-typed", "msgspec-raw-chunked",
    "msgspec-typed-streamed", "reader",
)


def _read(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def replicate(source: Path, target_mb: float, out: Path) -> int:
    """Write `source`'s top-level keys plus its events repeated to ~target_mb; return events."""
    top = msgspec.json.decode(_read(source), type=dict[str, msgspec.Raw])
    events = bytes(top.pop("traceEvents")).strip()[1:-1].strip()
    n_events = len(msgspec.json.decode(b"[" + events + b"]", type=list[msgspec.Raw]))
    copies = max(1, round(target_mb * 1e6 / len(events)))
    with open(out, "wb") as f:
        f.write(b"{")
        for key, value in top.items():
            f.write(json.dumps(key).encode() + b": " + bytes(value) + b",\n")
        f.write(b'"traceEvents": [')
        for i in range(copies):
            f.write(events if i == 0 else b",\n" + events)
        f.write(b"]}")
    return n_events * copies


def _decode(method: str, path: Path) -> int:
    """Run one decoder; return how many events it produced (to show it did the work)."""
    if method == "reader":
        from traceanalyzer.ingest.kineto import read

        trace = read(path)
        return sum(t.num_rows for t in trace.tables.values())
    if method == "msgspec-typed-streamed":
        # What the reader does now: the same typed decode, a chunk of the file at a time
        # (kineto_stream), each chunk dropped once decoded.
        from traceanalyzer import input_limits as limits
        from traceanalyzer.ingest.kineto_stream import EventStream

        with limits.json_depth():
            return sum(len(chunk) for chunk in EventStream(path))
    data = path.read_bytes()
    if method == "json":
        return len(json.loads(data)["traceEvents"])
    if method == "orjson":
        import orjson

        return len(orjson.loads(data)["traceEvents"])
    if method == "msgspec-untyped":
        return len(msgspec.json.decode(data)["traceEvents"])
    if method == "msgspec-typed":
        # What the reader does first: top level as raw slices, events typed, args raw.
        from traceanalyzer.ingest.kineto_events import Event

        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
        return len(msgspec.json.decode(top["traceEvents"], type=list[Event]))
    if method == "msgspec-raw-chunked":
        # Leaner variant: events as raw slices, then typed in chunks keeping only those
        # a table uses (python_function, flows and metadata never become objects).
        from traceanalyzer.ingest.kineto_events import Event, role_of

        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
        raws = msgspec.json.decode(top["traceEvents"], type=list[msgspec.Raw])
        kept = []
        for i in range(0, len(raws), 50_000):
            chunk = msgspec.json.decode(b"[" + b",".join(raws[i:i + 50_000]) + b"]", type=list[Event])
            kept += [e for e in chunk if role_of(e.cat) or e.name == "[memory]"]
        return len(kept)
    if method == "msgspec-typed-fullargs":
        return len(msgspec.json.decode(data, type=_full_args_file()).traceEvents)
    raise SystemExit(f"unknown method {method}")


def _full_args_file():
    return FullArgsFile


# The alternative design: one pass, args decoded for every event into a Struct that has
# every field any category needs (most stay None). Module level: msgspec resolves the
# postponed annotations from module globals.
class AllArgs(msgspec.Struct, gc=False):
    external_id: int | None = msgspec.field(default=None, name="External id")
    device: int | None = None
    context: int | None = None
    stream: int | str | None = None
    correlation: int | None = None
    registers_per_thread: int | None = msgspec.field(default=None, name="registers per thread")
    shared_memory: int | None = msgspec.field(default=None, name="shared memory")
    blocks_per_sm: float | None = msgspec.field(default=None, name="blocks per SM")
    occupancy: float | None = msgspec.field(default=None, name="est. achieved occupancy %")
    grid: list[int] | None = None
    block: list[int] | None = None
    bytes: int | None = None
    sequence_number: int | None = msgspec.field(default=None, name="Sequence number")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    device_type: int | None = msgspec.field(default=None, name="Device Type")
    device_id: int | None = msgspec.field(default=None, name="Device Id")
    addr: int | None = msgspec.field(default=None, name="Addr")
    total_allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    total_reserved: int | None = msgspec.field(default=None, name="Total Reserved")


class FullEvent(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: AllArgs | None = None


class FullArgsFile(msgspec.Struct):
    traceEvents: list[FullEvent] = msgspec.field(default_factory=list)


def _peak_rss_bytes() -> int:
    # VmHWM, not ru_maxrss: ru_maxrss survives fork+exec, so a child would inherit the
    # parent's high-water mark (which holds the whole replicated file).
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_one(method: str, path: Path) -> None:
    """Child process: report time and the peak RSS the decode added."""
    sys.path.insert(0, str(ROOT))
    # Imported before the baseline: import cost is not decode cost.
    import pyarrow  # noqa: F401

    import traceanalyzer.ingest.kineto  # noqa: F401

    before = _peak_rss_bytes()
    t0 = time.perf_counter()
    n = _decode(method, path)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "added_peak_bytes": _peak_rss_bytes() - before, "items": n}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--repeat", type=int, default=3, help="runs per method; the best time is kept")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--run", nargs=2, metavar=("METHOD", "FILE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        run_one(a.run[0], Path(a.run[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big_trace.json"
        n_events = replicate(a.source, a.mb, path)
        size = path.stat().st_size
        print(f"file: {size / 1e6:.1f} MB, {n_events} events (from {a.source.name})")
        print(f"{'method':<24}{'seconds':>9}{'MB/s':>8}{'x json':>8}{'peak MB':>9}{'peak/file':>10}")
        base = None
        for method in a.methods.split(","):
            runs = []
            for _ in range(a.repeat):
                p = subprocess.run(
                    [sys.executable, __file__, "--run", method, str(path)],
                    capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"},
                )
                if p.returncode != 0:
                    print(f"{method:<24} failed: {p.stderr.strip().splitlines()[-1:]}")
                    break
                runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
            if not runs:
                continue
            best = min(runs, key=lambda r: r["seconds"])
            peak = max(r["added_peak_bytes"] for r in runs)
            base = base or best["seconds"]
            print(
                f"{method:<24}{best['seconds']:>9.2f}{size / 1e6 / best['seconds']:>8.0f}"
                f"{base / best['seconds']:>8.2f}{peak / 1e6:>9.0f}{peak / size:>10.2f}"
            )


if __name__ == "__main__":
    main()
