"""Decode a Kineto trace's `traceEvents` a chunk at a time, straight from the file.

The file (plain or gzip) is read in blocks. The top-level keys
before `traceEvents` are decoded once the key is found; the array is then cut at event
boundaries into chunks of about `READ_BYTES`, each decoded on its own into typed
`Event`s (`[` + chunk + `]`), handed to the caller and dropped; the keys after the array
are decoded at the end. Peak memory is one chunk plus what the caller keeps, not the
file.

A cut is a `}` `,` `{` sequence (whitespace allowed), the last one in the text read so
far. One inside a string or a nested object can only make the chunk it ends unbalanced,
and so undecodable: an earlier cut is tried, then more text is read. Anything else
unusual (invalid JSON, a wrong value type, nesting near the depth limit, a duplicate
`traceEvents` key, a corrupt or truncated gzip, no usable cut in `MAX_PENDING_BYTES`)
raises `Unstreamable`, and the reader decodes the whole file in one piece, which gives the
exact error (or, for a file that only looked odd, the exact result). So streaming never
decides what a file means, only how much of it is in memory at once. (A gzip over the
inflation limits fails here directly, with the error and at the byte `input_limits.gunzip`
would.)
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
from msgspec import Raw

from .. import input_limits
from .detect import GZIP_MAGIC
from .kineto_events import Event

# 4 MB: on the 400 MB benchmark trace as fast as 8 MB, and ~90 MB less at the peak (fewer
# decoded events alive at once; 2 MB saved 20 MB more but ran slower).
READ_BYTES = 4 << 20
# Give up streaming (decode the whole file) when this much text has no usable cut, or
# the top-level keys before `traceEvents` are longer than this.
MAX_PENDING_BYTES = 128 << 20
MAX_BAD_CUTS = 4
# The last cuts of the text read so far are looked for in this many bytes at its end.
CUT_WINDOW_BYTES = 256 << 10
BOM = b"\xef\xbb\xbf"
_KEY = b'"traceEvents"'
_AFTER_KEY = re.compile(rb"\s*:\s*\[")
_KEY_SO_FAR = re.compile(rb"\s*(:\s*)?")
CUT = re.compile(rb"\}\s*,\s*\{")
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
# Chunks are decoded with a depth limit this much below MAX_JSON_DEPTH, so that nothing
# the whole-file decode would refuse as too deep streams through.
_DEPTH_MARGIN = 3

_EVENTS = msgspec.json.Decoder(list[Event])
_TOP = msgspec.json.Decoder(dict[str, Raw])
_ANY_RAW = msgspec.json.Decoder(Raw)


class Unstreamable(Exception):
    """This file is decoded whole instead (see the module docstring)."""


def _decode(decoder: msgspec.json.Decoder, data: bytes):
    with input_limits.json_depth(input_limits.get("MAX_JSON_DEPTH") - _DEPTH_MARGIN):
        return decoder.decode(data)


class EventStream:
    """Iterate to get lists of events; afterwards `top` holds the top-level keys in file
    order (`traceEvents` mapped to an empty Raw)."""

    def __init__(self, path: Path, *, stop: int | None = None, start: int = 0,
                 bare_array: bool = False):
        """`start` (a file offset where an event starts): begin there, inside the array
        (`bare_array` says which kind of file it is). `stop` (another such offset): read
        only up to it, the text before it ending in `,`; the events from there on are
        another reader's. Without `stop`, read to the end of the array and the top-level
        keys after it. Both only for plain files (see `kineto_parts`)."""
        self.path = path
        self.top: dict[str, Raw] = {}
        self.bare_array = bare_array
        self.stop, self.start = stop, start

    # -- bytes --------------------------------------------------------------------------

    def _blocks(self) -> Iterator[bytes]:
        try:
            f = open(self.path, "rb")
        except OSError:
            raise Unstreamable from None
        with f:
            if self.start:
                f.seek(self.start)
            left = None if self.stop is None else self.stop - self.start  # bytes still to read, or None for all
            raw = f.read(READ_BYTES if left is None else min(READ_BYTES, left))
            if raw[:2] != GZIP_MAGIC:
                while raw:
                    yield raw
                    if left is not None:
                        left -= len(raw)
                        if left <= 0:
                            return
                    raw = f.read(READ_BYTES if left is None else min(READ_BYTES, left))
                return
            if self.stop is not None or self.start:
                raise Unstreamable
            yield from self._inflate(f, raw)

    @staticmethod
    def _read(f) -> bytes:
        return f.read(READ_BYTES)

    def _inflate(self, f, data: bytes) -> Iterator[bytes]:
        """Like `input_limits.gunzip` (all members, zero padding, the same limits), a block at a
        time; any problem is left for `input_limits.gunzip` to report."""
        try:
            guard = input_limits.InflateGuard(os.fstat(f.fileno()).st_size)
            while True:
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                while not d.eof:
                    if not data:
                        data = self._read(f)
                    piece = d.decompress(data, min(READ_BYTES, guard.room()))
                    data = d.unconsumed_tail
                    guard.add(len(piece))
                    if piece:
                        yield piece
                    elif not data and not d.eof:
                        more = self._read(f)
                        if not more:  # input ended: flush, else truncated
                            while not d.eof and (piece := d.decompress(b"", min(READ_BYTES, guard.room()))):
                                guard.add(len(piece))
                                yield piece
                            if not d.eof:
                                raise Unstreamable
                        data = more
                data = d.unused_data  # all input past the member (unconsumed_tail may repeat it)
                while True:
                    data = data.lstrip(b"\x00")
                    if len(data) >= 2:
                        break
                    more = self._read(f)
                    if not more:
                        break
                    data += more
                if not data:
                    return
                if data[:2] != GZIP_MAGIC:
                    raise Unstreamable
        except zlib.error:
            raise Unstreamable from None
        # A TraceError from the guard (over an inflation limit) is the file's error: the
        # whole-file inflate stops at the same byte with the same message.

    # -- JSON ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[Event]]:
        blocks = self._blocks()
        buf = b""
        eof = False

        def more() -> bool:
            nonlocal buf, eof
            if eof:
                return False
            block = next(blocks, None)
            if block is None:
                eof = True
                return False
            buf += block
            return True

        if self.start:  # inside the array already (a part after the first, see kineto_parts)
            yield from self._events(blocks, [], 0)
            return
        # The opening: BOM, whitespace, `{` or `[`.
        while len(buf) < len(BOM) and more():
            pass
        buf = buf.removeprefix(BOM)
        while not buf.lstrip():
            buf = b""  # whitespace (bounded: a gzip of nothing but spaces)
            if not more():
                break
        start = len(buf) - len(buf.lstrip())
        first = buf[start:start + 1]
        if first == b"[":
            self.bare_array = True
            pos = start + 1
        elif first == b"{":
            pos = self._find_events(start, more, lambda: buf)
            buf = buf[pos:]
            pos = 0
        else:
            raise Unstreamable

        rest = buf[pos:]
        del buf
        yield from self._events(blocks, [rest], len(rest))

    def _events(self, blocks: Iterator[bytes], pending: list[bytes], size: int) -> Iterator[list[Event]]:
        """Chunks of events from the text in `pending` (starting at an event, or at the
        array's end) and the blocks after it."""
        # Blocks are joined only when the newest one holds a cut, so text without any (a
        # gzip of spaces) is not copied over and over.
        while True:
            block = next(blocks, None)
            if block is None:
                text = b"".join(pending)
                yield self._tail(text) if self.stop is None else self._before_stop(text)
                return
            pending.append(block)
            size += len(block)
            if CUT.search(block) is not None:
                text = b"".join(pending)
                events, pos = self._cut(text, 0)
                if events is not None:
                    yield events
                    del events
                    pending = [text[pos:]]
                    size = len(pending[0])
                    continue
                pending = [text]
            if size > MAX_PENDING_BYTES:
                raise Unstreamable

    @staticmethod
    def _cut(buf: bytes, pos: int) -> tuple[list[Event] | None, int]:
        """Decode the events from `pos` to the last cut in `buf` that gives a valid chunk
        (the last few cuts are tried); return them and where the next event starts."""
        cuts = list(CUT.finditer(buf, max(pos, len(buf) - CUT_WINDOW_BYTES)))
        if not cuts:
            cuts = list(CUT.finditer(buf, pos))
        for m in reversed(cuts[-MAX_BAD_CUTS:]):
            try:
                return _decode(_EVENTS, b"".join((b"[", memoryview(buf)[pos:m.start() + 1], b"]"))), m.end() - 1
            except msgspec.ValidationError:
                raise Unstreamable from None
            except msgspec.DecodeError:  # a cut inside a string or nested object: try an earlier one
                continue
            except RecursionError:
                raise Unstreamable from None
        return None, pos

    def _find_events(self, start: int, more, get_buf) -> int:
        """Decode the keys before `"traceEvents": [` into `top`; return where the array's
        content starts."""
        scan = start
        while True:
            buf = get_buf()
            p = buf.find(_KEY, scan)
            if p < 0:
                if len(buf) > MAX_PENDING_BYTES or not more():
                    raise Unstreamable
                scan = max(start, len(buf) - len(_KEY))
                continue
            # Is this a key of the top-level object? Then the text before it, closed with a
            # dummy member, is a valid object (anywhere else it is not).
            try:
                prefix = _decode(_TOP, buf[start:p] + b'"traceEvents":0}')
            except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
                scan = p + 1
                continue
            while True:
                buf = get_buf()
                m = _AFTER_KEY.match(buf, p + len(_KEY))
                if m is not None:
                    break
                # Not `: [` yet: need more text, or the value is not an array.
                if not _KEY_SO_FAR.fullmatch(buf, p + len(_KEY)) or not more():
                    raise Unstreamable
            prefix.pop("traceEvents")
            self.top = prefix
            self.top["traceEvents"] = Raw(b"")
            return m.end()

    @staticmethod
    def _before_stop(text: bytes) -> list[Event]:
        """The last events before `stop`: the text must be whole events and a comma.
        Decoding it proves `stop` is where an event of the array starts (JSON is read
        left to right without going back, so a text that parses up to a top-level `,`
        parses the same way inside the whole file)."""
        body = text.rstrip()
        if not body.endswith(b","):
            raise Unstreamable
        try:
            return _decode(_EVENTS, b"[" + body[:-1] + b"]")
        except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
            raise Unstreamable from None

    def _tail(self, text: bytes) -> list[Event]:
        """The last events, up to the array's `]`, and the top-level keys after it."""
        data = b"[" + text
        try:
            _decode(_ANY_RAW, data)
            end = len(data)  # nothing follows the array
        except msgspec.DecodeError as e:
            m = _TRAILING.search(str(e))
            if m is None:
                raise Unstreamable from None
            end = int(m.group(1)) - 1
        except RecursionError:
            raise Unstreamable from None
        events_text, after = data[:end].rstrip(), data[end:].lstrip()
        if not events_text.endswith(b"]"):
            raise Unstreamable
        try:
            events = _decode(_EVENTS, events_text)
            if self.bare_array:
                if after:
                    raise Unstreamable
                return events
            if after[:1] == b",":
                suffix = _decode(_TOP, b"{" + after[1:])
                if not suffix:  # `, }`: a trailing comma
                    raise Unstreamable
            elif after[:1] == b"}":
                suffix = _decode(_TOP, b"{" + after)
            else:
                raise Unstreamable
        except (msgspec.DecodeError, RecursionError):
            raise Unstreamable from None
        if "traceEvents" in suffix:  # a second `traceEvents`: the whole-file decode keeps the last
            raise Unstreamable
        self.top.update(suffix)
        return events
