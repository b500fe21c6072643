"""Read a big plain Kineto file in two processes: this one from the start, a helper from
about the middle.

Decoding and collecting events is Python work that holds the GIL, so a second core only
helps from a second process. The helper is a fresh interpreter (`python -m` this module:
no DuckDB, no pandas, none of the caller's state) that reads the file from an event
boundary near the middle (`split_point`) to the end with `EventStream(start=...)`,
collects the events like the main reader does, and writes that `Collector` and the
top-level keys after the array to its stdout, a temporary file of the caller's
(`kineto_wire`: JSON and Arrow IPC, no pickle). The main process meanwhile reads from the
start up to that offset (`EventStream(stop=...)`), then appends the helper's columns
(`Collector.merge`), so the tables are exactly those of a read in one pass.

The split point is found by a text search, so it could fall inside a string or a nested
object; the main part then fails to decode its last events (see
`EventStream._before_stop`) and the caller reads the file again in one pass. Any failure
of the helper (a bad event, a crash, a kill, no way to start it) has the same outcome: the
one-pass read is the reference, which also reports the exact error for a bad file.

Only plain files of `MIN_SPLIT_BYTES` or more are split (a gzip stream cannot be entered
in the middle), only when two CPUs are usable and the caller's `Resources.split_read` allows
it: not in `scan` workers of one CPU each (`scan.JobPlan`), which keep every core busy
already, and not with `TRACEANALYZER_READ_PROCESSES=1` (read in `Resources.available()`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from msgspec import Raw

from .. import input_limits, prefetch
from ..resources import Resources, usable_cpus
from .base import TraceError
from .detect import GZIP_MAGIC
from . import kineto_wire
from .kineto_collect import Collector
from .kineto_stream import BOM, _CUT, EventStream, Unstreamable

MIN_SPLIT_BYTES = 64 << 20
# The helper reads from here on: a bit past the middle, because it starts later (a fresh
# interpreter) and its columns have to be sent over to this process. On the 400 MB
# benchmark trace, 0.5 to 0.6 measured: 0.55 first looked best; 0.58 against 0.55 in 18
# alternated reads since, median 1.38-1.41 s against 1.42-1.59 s (at 0.55 the helper's half
# still came in ~0.15 s after this process had read its own). With the helper 0.3 s quicker
# to start (no pandas, `prefetch.RefusePandas`), 0.52 was no better than 0.58 in 12 alternated
# ingests; with its part handed over in a file, 0.54 to 0.68 were within the noise.
HELPER_STARTS_AT = 0.58
# An event boundary is looked for in this much text after that point.
SEARCH_BYTES = 4 << 20
HEAD_BYTES = 64 << 10

def allowed(resources: Resources) -> bool:
    """Whether a split read may run: `resources.split_read`, and two usable CPUs."""
    return resources.split_read and usable_cpus() >= 2


@dataclass
class Split:
    offset: int  # where the helper starts: the `{` of an event, if the search was right
    bare_array: bool


def split_point(path: Path, min_bytes: int = MIN_SPLIT_BYTES) -> Split | None:
    """Where to split `path`, or None when it is not worth it or not possible."""
    try:
        size = path.stat().st_size
        if size < min_bytes:
            return None
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            at = int(size * HELPER_STARTS_AT)
            f.seek(at)
            window = f.read(SEARCH_BYTES)
    except OSError:
        return None
    if head[:2] == GZIP_MAGIC:
        return None
    first = head.removeprefix(BOM).lstrip()[:1]
    m = _CUT.search(window)
    if first not in (b"[", b"{") or m is None:
        return None
    return Split(at + m.end() - 1, first == b"[")


def _command(path: Path, split: Split) -> list[str]:
    return [sys.executable, "-m", __name__, str(path), str(split.offset), "1" if split.bare_array else "0"]


class Helper:
    """The helper process for the part of `path` from `split.offset` on. Unstreamable if it
    cannot be started (the caller reads the file in one pass instead)."""

    def __init__(self, path: Path, split: Split):
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        # What it sends is columns of part of the file: far below this, whatever the file.
        self.max_bytes = 16 * path.stat().st_size + (64 << 20)
        # It writes its part to an unnamed temporary file (about a tenth of the trace's size),
        # not to a pipe: through a pipe, 64 KiB and a process switch at a time, the 35 MB of
        # the 400 MB benchmark trace took ~0.2 s, all of it after this process had read its
        # own part. A file is written while this process still reads, and read back at once.
        self.out = None
        try:
            self.out = tempfile.TemporaryFile()
            self.proc = subprocess.Popen(_command(path, split), stdout=self.out, stderr=subprocess.DEVNULL,
                                         stdin=subprocess.DEVNULL, env=env)
        except OSError:  # no temporary file, no interpreter to start
            if self.out is not None:
                self.out.close()
            raise Unstreamable from None

    def result(self) -> tuple[Collector, dict[str, Raw]]:
        """The helper's Collector and top-level keys after the array; Unstreamable if it failed."""
        if self.proc.wait() != 0:
            raise Unstreamable
        try:
            self.out.seek(0)
            got = kineto_wire.load(self.out, self.max_bytes)
            if self.out.read(1) != b"":  # more than `dump` writes
                raise Unstreamable
        except (kineto_wire.WireError, OSError):  # it wrote something else, or the file broke
            raise Unstreamable from None
        return got

    def stop(self) -> None:
        """Kill the helper if it still runs (the main part failed, or was interrupted), and
        drop its file."""
        if self.proc.returncode is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


def read_part(path: Path, offset: int, bare_array: bool) -> tuple[Collector, dict[str, Raw]]:
    """The helper's work: the events from `offset` to the end of the array."""
    collector, stream = Collector(), EventStream(path, start=offset, bare_array=bare_array)
    with input_limits.json_depth():
        for events in stream:
            collector.add(events)
    return collector, stream.top


def _main(argv: list[str]) -> int:
    """Exit 0 with the part on stdout; exit 3 when the part cannot be streamed."""
    path, offset, bare = Path(argv[0]), int(argv[1]), argv[2] == "1"
    try:
        collector, top = read_part(path, offset, bare)
    except (Unstreamable, RecursionError, TraceError):
        return 3
    kineto_wire.dump(collector, top, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    # pyarrow would import pandas on its first `pa.array` (to check for pandas types): 0.3 s
    # of the helper's start, for a library it has no use for.
    sys.meta_path.insert(0, prefetch.RefusePandas())
    code = _main(sys.argv[1:])
    os._exit(code)  # the reader waits for the exit status: skip freeing what is about to vanish
