"""Static plots of the HTML report, drawn here as inline SVG.

Every string from a trace goes through `esc` (kernel names are arbitrary text); each
mark carries a <title>, which browsers show as a tooltip without any script.
"""

from __future__ import annotations

import html
import math
import re

from .. import fmt
from ..kernel_library import inductor_phrase

W = 960  # viewBox width; the CSS scales the plot to the page
TEXT_MAX_CHARS = 2000
_CTRL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

KERNEL_COLOR = "#3b6fd8"
MEMORY_BOUND = "#e8871e"
COMPUTE_BOUND = "#3b6fd8"
BOUND_COLORS = {"memory": MEMORY_BOUND, "compute": COMPUTE_BOUND, "balanced": "#9467bd", "latency": "#c44e52",
                "unknown": "#777"}
# B003's word for an estimate above the roof, which says nothing of what ran
_BOUND_LABELS = {"balanced": "balanced", "unknown": "not judged"}
ROOF_COLOR = "#444"
PEAK_COLOR = "#d62728"
# One color per stall reason, in the order of I001's REASONS (stable across kernels and runs).
STALL_COLORS = ("#d62728", "#ff7f0e", "#bcbd22", "#8c564b", "#9467bd", "#1f77b4", "#17becf",
                "#7f7f7f", "#c7c7c7", "#e377c2", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
                "#c5b0d5", "#c49c94", "#f7b6d2", "#2ca02c", "#dbdb8d", "#9edae5")


def esc(s, limit: int = TEXT_MAX_CHARS) -> str:
    """Text for HTML/SVG content and attributes: clipped to `limit` characters (a trace can
    hold megabyte-long names, and rule messages quote them), control characters replaced,
    entities escaped."""
    return html.escape(_CTRL.sub("\ufffd", clip(s, limit)), quote=True)


def clip(s, n: int) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def _svg(height: float, body: list[str], label: str, css: str = "plot") -> str:
    return (f'<svg class="{css}" viewBox="0 0 {W} {height:.0f}" role="img" aria-label="{esc(label)}" '
            f'xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>")


def _text(x, y, s, anchor="start", cls="lbl", extra="") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}"{extra}>{esc(s)}</text>'


def si(x: float, unit: str = "") -> str:
    """1.2e12 -> '1.2 T' (+unit)."""
    if x == 0:
        return f"0 {unit}".strip()
    x = float(f"{x:.3g}")  # round first, so 999.95e9 reads 1 T, not 1,000 G
    for p, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1), ("m", 1e-3), ("µ", 1e-6)):
        if abs(x) >= scale:
            return f"{fmt.sig3(x / scale)} {p}{unit}".strip()
    return f"{fmt.sig3(x)} {unit}".strip()


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


# -- top kernels -------------------------------------------------------------------------

LABEL_CHARS = 42  # what the 330 px left of the bars hold


def top_kernels(rows: list[dict]) -> str:
    """Horizontal bars: total time per kernel name, with count and share."""
    if not rows:
        return ""
    bar_h, gap, left, right = 20, 6, 330, 200
    top = 10
    height = top + len(rows) * (bar_h + gap) + 10
    vmax = max(r["total_ns"] or 0 for r in rows) or 1
    # As the CLI's tables: names that share a long start keep the words where they differ
    # (of their first TEXT_MAX_CHARS: a trace's name can be megabytes). A name kept whole (its
    # label would match another's) is clipped all the same: the bar's tooltip holds the name.
    labels = fmt.distinct_labels([clip(r["kernel"], TEXT_MAX_CHARS) for r in rows], LABEL_CHARS)
    body = []
    for i, (r, label) in enumerate(zip(rows, labels)):
        y = top + i * (bar_h + gap)
        w = max(1.0, (W - left - right) * (r["total_ns"] or 0) / vmax)
        tip = f"{r['kernel']}\n{fmt.num(r['count'])} launches, total {fmt.ns(r['total_ns'])}, mean {fmt.ns(r['mean_ns'])}, share {fmt.pct(r['share'])}"
        compiled = inductor_phrase(r["kernel"])
        if compiled:
            tip += f"\n{compiled}"
        body.append(f'<g><title>{esc(tip)}</title>'
                    + _text(left - 8, y + 14, clip(label, LABEL_CHARS), "end")
                    + f'<rect class="bar" x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{KERNEL_COLOR}"/>'
                    + _text(left + w + 6, y + 14, f"{fmt.ns(r['total_ns'])} · {fmt.pct(r['share'])} · {fmt.num(r['count'])}×")
                    + "</g>")
    return _svg(height, body, "Top kernels by total time")


# -- roofline ----------------------------------------------------------------------------

class _LogAxis:
    def __init__(self, lo: float, hi: float, p0: float, p1: float):
        self.lo, self.hi = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        if self.hi <= self.lo:
            self.hi = self.lo + 1
        self.p0, self.p1 = p0, p1

    def __call__(self, v: float) -> float:
        t = (math.log10(max(v, 1e-300)) - self.lo) / (self.hi - self.lo)
        return self.p0 + t * (self.p1 - self.p0)

    def decades(self) -> list[float]:
        return [10.0 ** k for k in range(self.lo, self.hi + 1)]

    @property
    def vmin(self) -> float:
        return 10.0 ** self.lo

    @property
    def vmax(self) -> float:
        return 10.0 ** self.hi


def _frame(ax: _LogAxis, ay: _LogAxis, xfmt, yfmt, xlabel: str, ylabel: str, left: float, top: float,
           right: float, bottom: float) -> list[str]:
    out = [f'<rect class="frame" x="{left}" y="{top}" width="{right - left}" height="{bottom - top}"/>']
    for v in ax.decades():
        x = ax(v)
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>')
        out.append(_text(x, bottom + 16, xfmt(v), "middle", "tick"))
    for v in ay.decades():
        y = ay(v)
        out.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
        out.append(_text(left - 6, y + 4, yfmt(v), "end", "tick"))
    out.append(_text((left + right) / 2, bottom + 36, xlabel, "middle", "axis"))
    out.append(_text(16, (top + bottom) / 2, ylabel, "middle", "axis",
                     f' transform="rotate(-90 16 {(top + bottom) / 2:.1f})"'))
    return out


def _bound(p: dict, xkey: str, ridge: float | None) -> str | None:
    """The bound B003 found, else the side of the ridge point the kernel sits on."""
    if p.get("bound") in BOUND_COLORS:
        return p["bound"]
    if ridge is None:
        return None
    return "memory" if p[xkey] < ridge else "compute"


def _legend(points: list[dict], xkey: str, ridge: float | None, x: float, y: float) -> list[str]:
    out = []
    for b in [b for b in BOUND_COLORS if any(_bound(p, xkey, ridge) == b for p in points)]:
        out.append(f'<circle cx="{x:.1f}" cy="{y - 4:.1f}" r="5" fill="{BOUND_COLORS[b]}" fill-opacity="0.75" stroke="#222"/>'
                   + _text(x + 9, y, _BOUND_LABELS.get(b, f"{b}-bound"), cls="tick"))
        x += 110
    return out


def _points(points: list[dict], ax, ay, xkey: str, ykey: str, ridge: float | None, tip) -> list[str]:
    total = sum(p["dur_ns"] or 0 for p in points) or 1
    out = []
    for i, p in enumerate(points):
        x, y = ax(p[xkey]), ay(p[ykey])
        r = 4 + 10 * math.sqrt((p["dur_ns"] or 0) / total)
        color = BOUND_COLORS.get(_bound(p, xkey, ridge), "#777")
        out.append(f'<g class="pt"><title>{esc(tip(p))}</title>'
                   f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{color}" fill-opacity="0.75" stroke="#222"/>'
                   + (_text(x + r + 3, y - 3, clip(p["kernel"], 32), cls="plbl") if i < 6 else "") + "</g>")
    return out


def roofline(data: dict) -> str:
    left, top, right, bottom = 90, 20, W - 30, 400
    height = bottom + 70
    pts = data["points"]
    if data["mode"] == "absolute":
        bw = data.get("bandwidth_bytes_per_s")
        roofs = data.get("roofs") or []
        xs = [p["ai"] for p in pts] + [r["flops_per_s"] / bw for r in roofs if bw]
        ys = [p["flops_per_s"] for p in pts] + [r["flops_per_s"] for r in roofs]
        ax = _LogAxis(min(xs) / 3, max(xs) * 3, left, right)
        ay = _LogAxis(min(ys) / 3, max(ys) * 3, bottom, top)
        body = _frame(ax, ay, lambda v: f"{v:g}", lambda v: si(v, "FLOP/s"), "arithmetic intensity (FLOP per DRAM byte)",
                      "performance", left, top, right, bottom)
        ridge = None
        for i, r in enumerate(roofs):
            peak = r["flops_per_s"]
            x_knee = peak / bw if bw else ax.vmin
            ridge = ridge if ridge is not None else (x_knee if bw else None)
            body.append(f'<line class="roof{" alt" if i else ""}" x1="{ax(max(x_knee, ax.vmin)):.1f}" y1="{ay(peak):.1f}" '
                        f'x2="{right}" y2="{ay(peak):.1f}"/>')
            body.append(_text(right - 4, ay(peak) - 5, f"{r['label']} peak {si(peak, 'FLOP/s')}", "end", "roofl"))
        if bw:
            top_peak = max((r["flops_per_s"] for r in roofs), default=ay.vmax)
            x_end = min(top_peak / bw, ax.vmax)
            body.append(f'<line class="roof" x1="{ax(ax.vmin):.1f}" y1="{ay(bw * ax.vmin):.1f}" '
                        f'x2="{ax(x_end):.1f}" y2="{ay(bw * x_end):.1f}"/>')
            body.append(_text(ax(ax.vmin) + 6, ay(bw * ax.vmin * 3) - 6, f"DRAM {si(bw, 'B/s')}", cls="roofl"))

        def tip(p):
            return (f"{p['kernel']}\n{p['launches']} launch(es), {fmt.ns(p['dur_ns'])}\n"
                    f"{'est. ' if p.get('estimate') else ''}{si(p['flop'], 'FLOP')} / {fmt.nbytes(p['dram_bytes'])} DRAM"
                    f" = {p['ai']:.3g} FLOP/B\n{si(p['flops_per_s'], 'FLOP/s')}"
                    + (f"\n{p['bound']}-bound (B003)" if p.get("bound") else ""))
        body += _points(pts, ax, ay, "ai", "flops_per_s", ridge, tip)
        body += _legend(pts, "ai", ridge, left, bottom + 60)
        label = "Roofline (FLOP/s against FLOP per DRAM byte)"
    else:
        xs = [p["x"] for p in pts] + [0.1, 10]
        ys = [p["y"] for p in pts] + [1]
        ax = _LogAxis(min(xs), max(xs), left, right)
        ay = _LogAxis(min(ys), 1, bottom, top)
        body = _frame(ax, ay, lambda v: f"{v:g}×", lambda v: f"{100 * v:g}%",
                      "compute share ÷ memory share (1 = ridge point)", "compute throughput (% of peak)",
                      left, top, right, bottom)
        # The roof: memory-bound below the ridge (y = x), compute-bound above it (y = 1).
        body.append(f'<polyline class="roof" points="{ax(ax.vmin):.1f},{ay(max(ax.vmin, ay.vmin)):.1f} '
                    f'{ax(1):.1f},{ay(1):.1f} {right},{ay(1):.1f}"/>')
        body.append(f'<line class="ridge" x1="{ax(1):.1f}" y1="{top}" x2="{ax(1):.1f}" y2="{bottom}"/>')
        body.append(_text(ax(1) + 4, bottom - 6, "ridge point", cls="roofl"))
        body.append(_text(right - 4, ay(1) - 5, "100% of peak compute (SM) throughput", "end", "roofl"))

        def tip(p):
            return (f"{p['kernel']}\n{p['launches']} launch(es), {fmt.ns(p['dur_ns'])}\n"
                    f"compute (SM) {fmt.pct(p['sm_share'])} of peak, memory {fmt.pct(p['mem_share'])} of peak\n"
                    + (f"{p['bound']}-bound (B003)" if p.get("bound") else
                       "memory-bound side" if p["x"] < 1 else "compute-bound side"))
        body += _points(pts, ax, ay, "x", "y", 1.0, tip)
        body += _legend(pts, "x", 1.0, left, bottom + 60)
        label = "Roofline placement from Speed-of-Light throughput shares"
    return _svg(height, body, label)


# -- stall reasons -----------------------------------------------------------------------

def stalls(data: dict, reason_order: list[str]) -> str:
    rows = data["kernels"]
    if not rows:
        return ""
    left, right, bar_h, gap, top = 300, 40, 18, 6, 10
    seen = {r for k in rows for r, v in k["profile"].items() if v}
    order = [r for r in reason_order if r in seen] + sorted(seen - set(reason_order))
    color = {r: STALL_COLORS[i % len(STALL_COLORS)] for i, r in enumerate(reason_order)}
    for i, r in enumerate(sorted(seen - set(reason_order))):
        color[r] = STALL_COLORS[(len(reason_order) + i) % len(STALL_COLORS)]
    body = []
    bw = W - left - right
    for i, k in enumerate(rows):
        y = top + i * (bar_h + gap)
        name = ("⚑ " if k["flagged"] else "") + clip(k["kernel"], 38)
        body.append(_text(left - 8, y + 13, name, "end"))
        x = left
        total = sum(v for v in k["profile"].values() if v) or 1
        for r in order:
            v = k["profile"].get(r) or 0
            if v <= 0:
                continue
            w = bw * v / total
            body.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.2f}" height="{bar_h}" fill="{color[r]}">'
                        f'<title>{esc(k["kernel"])}\n{esc(r.replace("_", " "))}: {v / total:.1%}</title></rect>')
            x += w
    y = top + len(rows) * (bar_h + gap) + 8
    lx = left
    for r in order:
        label = r.replace("_", " ")
        wlabel = 14 + 7 * len(label)
        if lx + wlabel > W - 10:
            lx, y = left, y + 18
        body.append(f'<rect x="{lx}" y="{y}" width="10" height="10" fill="{color[r]}"/>' + _text(lx + 14, y + 9, label, cls="tick"))
        lx += wlabel + 12
    return _svg(y + 20, body, "Warp stall reasons per kernel")


# -- memory ------------------------------------------------------------------------------

def _steps(columns: list[tuple[float, list[float], float]]) -> str:
    """Polyline points of a step plot: the level holds from one column with events to the next
    (a flat line, no slope across a stretch without events), then each column draws straight up
    and down through its values (x, ys) and leaves at its last value."""
    pts: list[str] = []
    level = None
    for x, ys, last in columns:
        for y in ([] if level is None else [level]) + ys + [last]:
            p = f"{x:.1f},{y:.1f}"
            if not pts or pts[-1] != p:
                pts.append(p)
        level = last
    return " ".join(pts)


def memory(data: dict) -> str:
    """One small panel per device: allocated bytes over time (min-max per column), peak marked."""
    panels = []
    left, right, ph = 90, W - 20, 150
    t0, span = data["t0_ns"], data["span_ns"]
    ncol = data["columns"]
    for s in data["series"]:
        cols = s["cols"]
        lo = min(0.0, min(c[1] for c in cols))
        hi = max(c[2] for c in cols) or 1.0
        reserved = [c[4] for c in cols if c[4] is not None]
        if reserved:
            hi = max(hi, max(reserved))
        hi *= 1.08
        top, bottom = 18, 18 + ph

        def X(col):
            return left + (right - left) * (col + 0.5) / ncol

        def Y(v):
            return bottom - (bottom - top) * (v - lo) / (hi - lo or 1)

        body = [f'<rect class="frame" x="{left}" y="{top}" width="{right - left}" height="{ph}"/>']
        for v in nice_ticks(lo, hi, 4):
            body.append(f'<line class="grid" x1="{left}" y1="{Y(v):.1f}" x2="{right}" y2="{Y(v):.1f}"/>')
            body.append(_text(left - 6, Y(v) + 4, fmt.nbytes(v), "end", "tick"))
        for v in nice_ticks(t0, t0 + span, 6):
            x = left + (right - left) * (v - t0) / span
            body.append(_text(x, bottom + 15, fmt.ns(v), "middle", "tick"))
        if reserved:
            pts = _steps([(X(c[0]), [Y(c[4])], Y(c[4])) for c in cols if c[4] is not None])
            body.append(f'<polyline class="reserved" points="{pts}"><title>reserved by the allocator</title></polyline>')
        # min and max of each column, in order: a dense stretch draws as a filled band
        pts = _steps([(X(c[0]), [Y(c[1]), Y(c[2])], Y(c[3])) for c in cols])
        body.append(f'<polyline class="mem" points="{pts}"/>')
        px = left + (right - left) * (s["peak_at_ns"] - t0) / span
        py = Y(s["peak_bytes"])
        where = "GPU" if s["device_type"] == "cuda" else str(s["device_type"]).upper()
        dev = f"{where} {s['device_id']}" if s["device_id"] is not None and s["device_id"] >= 0 else where
        peak_txt = f"peak {fmt.nbytes(s['peak_bytes'])} at {fmt.ns(s['peak_at_ns'])}"
        body.append(f'<circle class="peak" cx="{px:.1f}" cy="{py:.1f}" r="5" fill="{PEAK_COLOR}"><title>{esc(peak_txt)}</title></circle>')
        anchor = "end" if px > (left + right) / 2 else "start"
        body.append(_text(px + (-8 if anchor == "end" else 8), max(py - 6, top + 12), peak_txt, anchor, "peakl"))
        what = ("allocated (bytes requested) over the snapshot's recorded history" if s.get("history")
                else "allocated" if s["recorded"] else "net allocations since the trace began (no allocator total recorded)")
        body.append(_text(left, 12, f"{dev}: {what}, {s['events']:,} events", cls="ptitle"))
        panels.append(_svg(bottom + 24, body, f"Memory of {dev}"))
    return "".join(panels)


# -- memory by category ----------------------------------------------------------------------------

# One color per category of PyTorch's memory profiler (stable across runs); the peak is marked in black.
CATEGORY_COLORS = {"parameter": "#4e79a7", "optimizer_state": "#f28e2b", "input": "#9c755f", "temporary": "#bab0ac",
                   "activation": "#e15759", "gradient": "#59a14f", "autograd_detail": "#b07aa1", "unknown": "#76b7b2"}


def _label(category: str) -> str:
    return category.replace("_", " ")


def memory_categories(data: dict) -> str:
    """A stacked step plot of one device's memory by category, in PyTorch's stacking order, the
    peak marked with what it held."""
    left, right, top, ph = 90, W - 20, 22, 200
    bottom = top + ph
    cols, names = data["columns"], data["categories"]
    n = len(cols)
    hi = max(sum(c) for c in cols if c is not None) * 1.08 or 1.0
    t0, span = data["t0_ns"], data["span_ns"]

    def X(i: float) -> float:
        return left + (right - left) * i / n

    def Y(v: float) -> float:
        return bottom - (bottom - top) * v / hi

    body = [f'<rect class="frame" x="{left}" y="{top}" width="{right - left}" height="{ph}"/>']
    for v in nice_ticks(0, hi, 4):
        body.append(f'<line class="grid" x1="{left}" y1="{Y(v):.1f}" x2="{right}" y2="{Y(v):.1f}"/>')
        body.append(_text(left - 6, Y(v) + 4, fmt.nbytes(v), "end", "tick"))
    for v in nice_ticks(t0, t0 + span, 6):
        body.append(_text(left + (right - left) * (v - t0) / span, bottom + 15, fmt.ns(v), "middle", "tick"))
    # Each category's band: from the sum of those under it to that plus its own bytes, a column at a time.
    present = [k for k in range(len(names)) if any(c is not None and c[k] for c in cols)]
    below = [0.0] * n
    for k in present:
        name = names[k]
        upper, lower = [], []
        i = next(i for i, c in enumerate(cols) if c is not None)  # before the first step: nothing
        while i < n:
            a, b = below[i], below[i] + cols[i][k]
            j = i  # the columns after it at the same level: one stretch
            while j + 1 < n and below[j + 1] == a and cols[j + 1][k] == cols[i][k]:
                j += 1
            upper += [f"{X(i):.1f},{Y(b):.1f}", f"{X(j + 1):.1f},{Y(b):.1f}"]
            lower += [f"{X(i):.1f},{Y(a):.1f}", f"{X(j + 1):.1f},{Y(a):.1f}"]  # drawn back, right to left
            below[i:j + 1] = [b] * (j + 1 - i)
            i = j + 1
        body.append(f'<polygon class="band" points="{" ".join(upper + lower[::-1])}" '
                    f'fill="{CATEGORY_COLORS.get(name, "#999")}"><title>{esc(_label(name))}</title></polygon>')
    total = data["peak_bytes"]
    px = left + (right - left) * (data["peak_at_ns"] - t0) / span
    py = Y(total)
    split = ", ".join(f"{_label(c)} {fmt.nbytes(b)} ({fmt.pct(b / total) if total else '-'})" for c, b in data["peak_split"])
    peak_txt = f"peak {fmt.nbytes(total)} at {fmt.ns(data['peak_at_ns'])}: " + ", ".join(
        f"{_label(c)} {fmt.pct(b / total) if total else '-'}" for c, b in data["peak_split"][:2])
    # a guide down from the dot: a peak one time step long is a spike a pixel wide
    body.append(f'<line class="peakline" x1="{px:.1f}" y1="{py:.1f}" x2="{px:.1f}" y2="{bottom}"/>')
    body.append(f'<circle class="peakdot" cx="{px:.1f}" cy="{py:.1f}" r="4"><title>{esc(f"peak {fmt.nbytes(total)}: {split}")}</title></circle>')
    anchor = "end" if px > (left + right) / 2 else "start"
    body.append(_text(px + (-8 if anchor == "end" else 8), max(py - 6, top + 12), peak_txt, anchor, "peakk"))
    body.append(_text(left, 14, f"GPU {data['device_id']}: memory by category, {data['steps']:,} time steps", cls="ptitle"))
    y = bottom + 34
    body += _swatches([(CATEGORY_COLORS.get(names[k], "#999"), _label(names[k])) for k in present], left, y)
    return _svg(y + 14, body, f"Memory by category of GPU {data['device_id']}")


def _swatches(items: list[tuple[str, str]], x0: float, y: float) -> list[str]:
    """A legend: a colored square and its label each, in one line."""
    out, x = [], x0
    for color, label in items:
        out.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="11" height="11" fill="{color}"/>'
                   + _text(x + 15, y, label, cls="tick"))
        x += 28 + 6.5 * len(label)
    return out


# -- segment map -----------------------------------------------------------------------------------

# Block states as the map colors them: a live tensor, freed but still in use by a stream, and
# free memory the allocator keeps, beside live tensors (stranded) or in a wholly free segment
# (cached: released by torch.cuda.empty_cache() or when the allocator needs room).
SEGMENT_COLORS = {"active_allocated": "#4e79a7", "active_pending_free": "#f28e2b", "stranded": "#f3b6b6",
                  "cached": "#dfe3e8"}
SEGMENT_LABELS = {"active_allocated": "allocated (live tensor)", "active_pending_free": "freed, pending on a stream",
                  "stranded": "free, beside live tensors", "cached": "free segment (cached)"}
LARGEST_FREE_COLOR = "#d62728"
MAP_ROW_H, MAP_ROW_GAP, MAP_MAX_ROWS = 16, 7, 40


def _row_bytes(segments: list[dict]) -> int:
    """How many bytes one row of the map holds: about the square root of the segment count in
    rows (at most MAP_MAX_ROWS), and a row no narrower than the largest segment unless that one
    is more than half of all (then it wraps over rows itself)."""
    total = sum(s["bytes"] for s in segments)
    rows = min(max(round(math.sqrt(len(segments))), 1), MAP_MAX_ROWS)
    return max(-(-total // rows), min(max(s["bytes"] for s in segments), -(-total // 2)), 1)


def _layout(segments: list[dict], row_bytes: int) -> list[int]:
    """Where each segment starts on one long tape of rows of `row_bytes`: one after the other,
    a segment that fits in a row moved to the next row rather than cut at the end of one.
    (Whole bytes: a row's end is exact.)"""
    starts, pos = [], 0
    for s in segments:
        used = pos % row_bytes
        if s["bytes"] <= row_bytes and used and used + s["bytes"] > row_bytes:
            pos += row_bytes - used
        starts.append(pos)
        pos += s["bytes"]
    return starts


def _pieces(a: int, b: int, row_bytes: int, x0: float, width: float, y0: float) -> list[tuple[float, float, float]]:
    """The interval [a, b) of the tape as (x, width, y) per row it lies on."""
    out = []
    while a < b:
        row = a // row_bytes
        end = min(b, (row + 1) * row_bytes)
        out.append((x0 + width * (a - row * row_bytes) / row_bytes, width * (end - a) / row_bytes,
                    y0 + row * (MAP_ROW_H + MAP_ROW_GAP)))
        a = end
    return out


def segment_map(data: dict) -> str:
    """Each segment of a snapshot a bar as long as its size, rows wrapped like lines of text
    (the scale on top), its blocks colored by state; the largest free block outlined and
    marked."""
    segs = data["segments"]
    left, right, top = 12, W - 12, 42
    width = right - left
    row_bytes = _row_bytes(segs)
    starts = _layout(segs, row_bytes)
    rows = -(-max(st + s["bytes"] for st, s in zip(starts, segs)) // row_bytes)
    body = []
    for v in nice_ticks(0, row_bytes, 6):
        x = left + width * v / row_bytes
        body.append(f'<line class="grid" x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" '
                    f'y2="{top + rows * (MAP_ROW_H + MAP_ROW_GAP) - MAP_ROW_GAP}"/>')
        body.append(_text(x, top - 9, fmt.nbytes(v), "middle" if v else "start", "tick"))
    seen, drawn = set(), []  # drawn: [start, end, kind, tip, blocks] on the tape
    narrow = row_bytes / width  # the bytes of a pixel: narrower blocks of one kind side by side draw as one
    for s, at in zip(segs, starts):
        where = (f"segment at 0x{s['address']:x}: {fmt.nbytes(s['bytes'])}, {s['type']} pool"
                 f"{', expandable' if s['expandable'] else ''}, stream {s['stream']}"
                 + (f", private pool {s['pool']}" if s["pool"] not in (None, "0,0") else ""))
        for off, n, state, requested in s["blocks"]:
            kind = state if state != "inactive" else ("stranded" if s["used"] else "cached")
            seen.add(kind)
            last = drawn[-1] if drawn else None
            if last and last[1] == at + off and last[2] == kind and n < narrow and last[4] and \
                    (last[1] - last[0]) / last[4] < narrow:
                last[1] += n
                last[4] += 1
                last[3] = f"{last[4]} blocks, {SEGMENT_LABELS.get(kind, kind)}: {fmt.nbytes(last[1] - last[0])}"
                continue
            tip = f"{SEGMENT_LABELS.get(kind, kind)}: {fmt.nbytes(n)}"
            if state != "inactive" and requested is not None and requested != n:
                tip += f" (requested {fmt.nbytes(requested)})"
            drawn.append([at + off, at + off + n, kind, tip + "\n" + where, 1])
    for a, b, kind, tip, _ in drawn:
        for x, w, y in _pieces(a, b, row_bytes, left, width, top):
            body.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{MAP_ROW_H}" '
                        f'fill="{SEGMENT_COLORS.get(kind, "#999")}"><title>{esc(tip)}</title></rect>')
    for s, at in zip(segs, starts):
        if s["bytes"] >= 1.5 * narrow:  # an outline on narrower ones would hide their blocks
            for x, w, y in _pieces(at, at + s["bytes"], row_bytes, left, width, top):
                body.append(f'<rect class="seg" x="{x:.2f}" y="{y}" width="{w:.2f}" height="{MAP_ROW_H}"/>')
    marked = ""
    if data.get("largest_free_at"):
        i, j = data["largest_free_at"]
        off, n, _, _ = segs[i]["blocks"][j]
        pieces = _pieces(starts[i] + off, starts[i] + off + n, row_bytes, left, width, top)
        for x, w, y in pieces:
            body.append(f'<rect class="largest" x="{x:.2f}" y="{y - 1}" width="{max(w, 2):.2f}" '
                        f'height="{MAP_ROW_H + 2}"/>')
        x, w, y = pieces[0]
        cx = x + max(w, 2) / 2
        body.append(f'<path class="largest-mark" d="M{cx - 5:.1f},{y - 8} L{cx + 5:.1f},{y - 8} L{cx:.1f},{y - 1} Z">'
                    f'<title>largest free block: {esc(fmt.nbytes(n))}</title></path>')
        marked = f"; largest free block {fmt.nbytes(n)} (▼)"
    title = (f"GPU {data['device_id']}: {len(segs):,} segments, {fmt.nbytes(data['reserved'])} reserved, "
             f"{fmt.nbytes(data['allocated'])} allocated{marked}; each row {fmt.nbytes(row_bytes)}")
    body.insert(0, _text(left, 14, title, cls="ptitle"))
    y = top + rows * (MAP_ROW_H + MAP_ROW_GAP) + 12
    items = [(SEGMENT_COLORS[k], SEGMENT_LABELS[k]) for k in SEGMENT_COLORS if k in seen]
    body += _swatches(items + ([(LARGEST_FREE_COLOR, "largest free block")] if marked else []), left, y)
    return _svg(y + 10, body, f"Segment map of GPU {data['device_id']}")
