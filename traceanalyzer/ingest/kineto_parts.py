"""Read a big plain Kineto file in parts, a process a part, on as many CPUs as the caller gives.

Decoding and collecting events is Python work that holds the GIL, so more cores only help
from more processes. A plain file of `MIN_PART_BYTES` or more per part is cut at event
boundaries (`plan`) into one part per read CPU (`Resources.read_cpus`: every usable CPU for
one `check`, a worker's share in `scan`, so one with `--jobs 1`). This process reads the
first part; each other part is read by a helper, a fresh interpreter (`python -m` this
module: none of the caller's state, and unlike multiprocessing's spawn it never runs the
caller's `__main__` again) that collects its events as a one-pass read does
(`EventStream(start=, stop=)` and `Collector`), and pickles the `Collector`, with the
top-level keys after the array when its part is the last, into an unnamed temporary file
of this process. The parts are merged in file order (`Collector.merge`), so the tables are
exactly those of a one-pass read. (pickle runs nothing here that the helper, our own code,
could not run anyway, and no other process can open the unnamed file.)

Boundaries are found by a text search, so one could fall inside a string or a nested
object; the part before it then fails to decode its last events (`EventStream`'s `stop`:
the text before it must be whole events and a comma) and the file is read again in one
pass. Any failure of a helper (a bad event, a crash, a kill, no way to start it) has the
same outcome: the one-pass read is the reference, and it reports the exact error of a bad
file. A gzip file is read in one pass (a gzip stream cannot be entered in the middle).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from msgspec import Raw

from .. import input_limits
from ..resources import Resources, usable_cpus
from .base import TraceError
from .detect import GZIP_MAGIC
from .kineto_collect import Collector
from .kineto_stream import BOM, CUT, EventStream, Unstreamable

# Below this much of the file per part, a helper's start (~0.3 s: an interpreter, numpy,
# pyarrow and msgspec, then pandas, which pyarrow imports at its first conversion) is not
# won back.
MIN_PART_BYTES = 32 << 20
# This process's part is this much longer than a helper's: the helpers start later and their
# columns are handed over at the end. `traceanalyzer ingest` of the 381 MB dense bench trace in
# two parts: 1.37x the one pass's speed with 1.3, 1.30x with equal parts (docs/performance.md).
FIRST_PART_WEIGHT = 1.3
# An event boundary is looked for in this much text after each cut point.
SEARCH_BYTES = 4 << 20
HEAD_BYTES = 64 << 10


@dataclass
class Plan:
    starts: list[int]  # where each part after the first begins: the `{` of an event, if the search was right
    bare_array: bool  # the file is a bare array of events, not an object with `traceEvents`


def plan(path: Path, resources: Resources) -> Plan | None:
    """The parts to read `path` in, or None to read it in one pass (one CPU, a small, gzip or
    odd file)."""
    try:
        size = path.stat().st_size
        parts = min(resources.read_cpus, usable_cpus(), size // MIN_PART_BYTES)
        if parts < 2:
            return None
        total_weight = FIRST_PART_WEIGHT + parts - 1
        cuts = [int(size * (FIRST_PART_WEIGHT + i) / total_weight) for i in range(parts - 1)]
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            windows = []
            for at in cuts:
                f.seek(at)
                windows.append(f.read(SEARCH_BYTES))
    except OSError:
        return None
    first = head.removeprefix(BOM).lstrip()[:1]
    if head[:2] == GZIP_MAGIC or first not in (b"[", b"{"):
        return None
    starts = []
    for at, window in zip(cuts, windows):
        m = CUT.search(window)
        if m is None:
            return None
        starts.append(at + m.end() - 1)
    if starts != sorted(set(starts)):  # two cut points found the same boundary
        return None
    return Plan(starts, first == b"[")


def read(path: Path, plan: Plan) -> tuple[dict[str, Raw], Collector]:
    """The top-level keys and the merged Collector of every part; Unstreamable if any part
    fails (the caller reads the file in one pass)."""
    ends = [*plan.starts[1:], None]
    helpers: list[_Helper] = []
    try:
        for start, stop in zip(plan.starts, ends):
            helpers.append(_Helper(path, start, stop, plan.bare_array))
        stream = EventStream(path, stop=plan.starts[0])
        collector = _collect(stream)
        if stream.bare_array != plan.bare_array:
            raise Unstreamable
        top = stream.top
        for helper in helpers:
            part, after = helper.result()
            collector.merge(part)
            top.update(after)  # the keys after the array (the last part's), as a one-pass read adds them
        return top, collector
    finally:
        for helper in helpers:
            helper.stop()


def _collect(stream: EventStream) -> Collector:
    collector = Collector()
    for events in stream:
        collector.add(events)
    return collector


def _command(path: Path, start: int, stop: int | None, bare_array: bool) -> list[str]:
    return [sys.executable, "-m", __name__, str(path), str(start), "-" if stop is None else str(stop),
            "1" if bare_array else "0"]


class _Helper:
    """The helper process for the part of `path` from `start` to `stop` (None: to the end).
    Unstreamable if it cannot be started."""

    def __init__(self, path: Path, start: int, stop: int | None, bare_array: bool):
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        # A file, not a pipe: through a pipe (64 KiB and a process switch at a time) a part's
        # columns would be moved after this process has read its own; a file is written while
        # this process still reads, and read back at once.
        self.out = None
        try:
            self.out = tempfile.TemporaryFile()
            self.proc = subprocess.Popen(_command(path, start, stop, bare_array), stdout=self.out, stderr=subprocess.DEVNULL,
                                         stdin=subprocess.DEVNULL, env=env)
        except OSError:  # no temporary file, no interpreter to start
            if self.out is not None:
                self.out.close()
            raise Unstreamable from None

    def result(self) -> tuple[Collector, dict[str, Raw]]:
        """The part's Collector and the top-level keys after the array ({} but for the last part)."""
        if self.proc.wait() != 0:
            raise Unstreamable
        try:
            self.out.seek(0)
            collector, top = pickle.load(self.out)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError):
            raise Unstreamable from None
        return collector, top

    def stop(self) -> None:
        """Kill the helper if it still runs (another part failed, or the read was interrupted),
        and drop its file."""
        if self.proc.returncode is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


def read_part(path: Path, start: int, stop: int | None, bare_array: bool) -> tuple[Collector, dict[str, Raw]]:
    """A helper's work: the events from `start` to `stop` (None: to the end of the array, and
    the top-level keys after it)."""
    stream = EventStream(path, start=start, stop=stop, bare_array=bare_array)
    with input_limits.json_depth():
        collector = _collect(stream)
    return collector, stream.top


def _main(argv: list[str]) -> int:
    """Exit 0 with the part pickled on stdout; 3 when the part cannot be streamed."""
    path, start, stop, bare = Path(argv[0]), int(argv[1]), None if argv[2] == "-" else int(argv[2]), argv[3] == "1"
    try:
        part = read_part(path, start, stop, bare)
    except (Unstreamable, RecursionError, TraceError):
        return 3
    pickle.dump(part, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    code = _main(sys.argv[1:])
    os._exit(code)  # the reader waits for the exit status: skip freeing what is about to vanish
