"""Text for a terminal: tables laid out for the console's width (`fit_table`, with the line
naming the columns left out), plain lines wrapped between words (`say`), trace text shown as
written (`cell`); and the tables of `query` and `rules`. The other text renderers
(`diff_text`, `runs_text`, `ranges_text`, `scan_text`) use these."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from .. import fmt


def cell(s) -> Text:
    """A table cell holding trace text: shown as written (no rich markup), controls escaped."""
    return Text(fmt.printable(s))


# -- tables that fit the terminal ----------------------------------------------------------

# Without outer borders, two spaces between columns and one rule under the header: what a table
# that does not fit with its box takes instead (summary, runs, diff), and the scan table always.
# (rich lays out collapse_padding with pad_edge one column short: never the two together.)
COMPACT = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "collapse_padding": True}


def _plain(console: Console, x) -> str:
    if x is None:
        return ""
    return x.plain if isinstance(x, Text) else console.render_str(x).plain if isinstance(x, str) else str(x)


def _bounds(console: Console, column: Column, cells: list) -> tuple[int, int]:
    """The narrowest and widest `column` can be laid out. A no_wrap column (numbers, ids) keeps
    each cell whole; another breaks its cells between words, no narrower than its min_width, or,
    folding (a file or kernel name), anywhere past its min_width. Headers and footers break
    between words."""
    texts = [_plain(console, c) for c in cells]
    labels = [_plain(console, column.header), _plain(console, column.footer)]
    lines = [ln for t in texts for ln in t.split("\n")]
    words = [w for t in texts for w in t.split()]
    label_words = [w for t in labels for w in t.split()]
    longest = max(map(cell_len, label_words), default=0)
    widest = max(map(cell_len, lines), default=0)
    if column.no_wrap:
        low = max(longest, widest, 1)
    elif column.overflow == "fold" and column.min_width:
        low = max(longest, min(column.min_width, widest), 1)
    else:
        low = max(longest, min(column.min_width or 0, widest), *map(cell_len, words), 1)
    high = max(low, *map(cell_len, lines + labels))
    return low, high


def _overhead(console: Console, n: int, table_args: dict) -> int:
    """The columns borders and padding take in a table of `n` columns laid out as `table_args`."""
    t = Table(*(Column(width=1) for _ in range(n)), **table_args)
    return Measurement.get(console, console.options.update_width(10_000), t).maximum - n


def fit_table(console: Console, columns: Sequence[Column], rows: Sequence[Sequence], optional: Sequence[str] = (),
              **table_args) -> tuple[Table, list[str]]:
    """A table of `columns` and `rows` laid out for the console's width: no number or other no_wrap
    cell cut, no word broken (but in a folding column past its min_width), headers broken between
    words rather than cut. Where it does not fit so, it goes without its outer borders (`COMPACT`),
    then without the `optional` columns (headers), the first given first, as few as it takes. The room left is shared
    between the columns that can use it. Returns the table and the headers left out, in table order."""
    cols = [replace(c, _cells=[]) for c in columns]  # the caller's columns stay as given
    bounds = [_bounds(console, c, [row[i] for row in rows]) for i, c in enumerate(cols)]
    headers = [_plain(console, c.header) for c in cols]
    keep = list(range(len(cols)))
    args = dict(table_args)

    def fits() -> bool:
        return sum(bounds[i][0] for i in keep) + _overhead(console, len(keep), args) <= console.width

    if not fits():
        args.update(COMPACT)
    dropped = []
    for name in optional:
        if fits():
            break
        dropped += [i for i in keep if headers[i] == name]
        keep = [i for i in keep if headers[i] != name]
    for i in reversed(dropped[:-1]):  # one left out early may fit beside the narrower ones
        keep = sorted(keep + [i])
        if not fits():
            keep.remove(i)
    widths = {i: bounds[i][0] for i in keep}
    spare = console.width - sum(widths.values()) - _overhead(console, len(keep), args)
    # The room left goes first to the columns that wrap (names: fewer lines), then to the others
    # (their headers on fewer lines): a character each in turn, up to its widest.
    for group in ([i for i in keep if not cols[i].no_wrap], [i for i in keep if cols[i].no_wrap]):
        while spare > 0:
            growing = [i for i in group if widths[i] < bounds[i][1]][:spare]
            if not growing:
                break
            for i in growing:
                widths[i] += 1
            spare -= len(growing)
    for i in keep:
        c = cols[i]
        c.width, c.max_width, c.min_width, c.ratio = widths[i], None, None, None
        if cell_len(headers[i]) > widths[i] and not isinstance(c.header, Text):
            c.header = "\n".join(_wrap_words(headers[i], widths[i]))
    t = Table(*(cols[i] for i in keep), **args)
    for row in rows:
        t.add_row(*(row[i] for i in keep))
    return t, [headers[i] for i in range(len(cols)) if i not in keep]


def _wrap_words(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for word in text.split():
        if lines and cell_len(lines[-1]) + 1 + cell_len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def left_out(console: Console, dropped: list[str], more: str = "") -> None:
    """The line saying which columns a table left out to fit (`fit_table`), if any."""
    if dropped:
        say(console, f"(not shown at this width: {', '.join(dropped)}{more})")


# A number and its unit: one word to wrap ('38.8 us', '2.18 MB', '10.5 GB/s').
def say(console: Console, line: str) -> None:
    """A line of plain text wrapped between words at the console's width, each number on one line
    with its unit."""
    for piece in Text(fmt.glue_units(line)).wrap(console, console.width):
        console.print(fmt.unglue(piece.plain.rstrip()), markup=False, soft_wrap=True)


# -- the small commands' tables ------------------------------------------------------------

def query_table(df) -> Table:
    """A query's result (a DataFrame) as a table: its columns as named, each value as `fmt.text`
    writes it, trace text as written."""
    t = Table(*map(str, df.columns))
    for row in df.itertuples(index=False):
        t.add_row(*(cell(fmt.text(v, "")) for v in row))
    return t


def rules_table(console: Console, rules: Sequence) -> Table:
    """The rules (id, name, phase, severity, title), fitted to the console (titles wrap)."""
    t, _ = fit_table(console, [*(Column(h, no_wrap=True) for h in ("id", "name", "phase", "severity")), Column("title")],
                     [[r.id, r.name, r.phase, r.severity, r.title] for r in rules])
    return t
