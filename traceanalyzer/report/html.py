"""One self-contained HTML file for one run or many: summary, findings, plots.

The file needs nothing from the network: styles and the timeline's script are inlined
from `assets/`, plots are inline SVG, data sits in JSON blocks. A Content-Security-Policy
allows only those inlined blocks (by hash), so the page cannot load anything and a
string that slipped through unescaped could still not run. Every string from a trace is
escaped: `esc` for HTML, `json_block` for the JSON the script reads (which the script
only ever puts into the page as text).

Reports present: findings and their evidence come from the store as the rules wrote
them (`load_result`), numbers from `summary` and the small queries in `html_metrics`.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import re
from importlib import resources
from typing import Any

from .. import __version__, fmt, ranges, summary
from ..devices.stalls import REASONS
from ..rules import all_rules
from ..store import Store
from . import html_charts as charts
from . import html_metrics, html_timeline
from .budget import (budget_line, busy_split, no_budget_line, step_budgets_of, step_budgets_of_runs, warmup_line,
                     cause_words, without_kernels_line)
from .vendor import vendor_text
from .html_charts import clip, esc
from .model import CheckResult, loss_shares, place_of, run_order

TOP_KERNELS = 15
MAX_EVIDENCE_ROWS = 20
FOLD_INFO_OVER = 8  # findings in a run past which its info findings start folded
SHOWN_PER_RULE = 5  # findings of one rule and severity shown before the rest are folded
SEVERITY_ORDER = ("error", "warning", "info")


def asset(name: str) -> str:
    return resources.files("traceanalyzer.report").joinpath("assets", name).read_text(encoding="utf-8")


def json_block(obj: Any) -> str:
    """JSON safe inside <script type="application/json">: no '<', '>' or '&' can end the
    block or open a comment, and line separators cannot break the parse."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_plain)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _plain(o):
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


_num = html_metrics._f

# -- gathering -------------------------------------------------------------------------

# What each run holds that some part of its page reads, for many runs in one query: a part whose
# tables hold nothing of the run is left empty without its queries (each costs milliseconds, and
# most runs of a big store have no memory data, steps, Nsight Compute metrics or host frames).
# `frames_*`: the host frames `code_tree` groups by (ncu's per-launch ranges count as ranges).
_CONTENTS_SQL = """
SELECT r.run_id,
       EXISTS (SELECT 1 FROM kernels x WHERE x.run_id = r.run_id) AS kernels,
       EXISTS (SELECT 1 FROM memory_events x WHERE x.run_id = r.run_id)
         OR EXISTS (SELECT 1 FROM memory_segments x WHERE x.run_id = r.run_id)
         OR EXISTS (SELECT 1 FROM memory_blocks x WHERE x.run_id = r.run_id)
         OR EXISTS (SELECT 1 FROM allocator_events x WHERE x.run_id = r.run_id)
         OR EXISTS (SELECT 1 FROM memory_timeline x WHERE x.run_id = r.run_id) AS memory,
       EXISTS (SELECT 1 FROM kernel_metrics x WHERE x.run_id = r.run_id) AS metrics,
       EXISTS (SELECT 1 FROM steps x WHERE x.run_id = r.run_id) AS steps,
       EXISTS (SELECT 1 FROM cpu_ops x WHERE x.run_id = r.run_id) AS frames_op,
       EXISTS (SELECT 1 FROM ranges x WHERE x.run_id = r.run_id AND x.kind IN ('nvtx', 'user_annotation'))
         OR EXISTS (SELECT 1 FROM launch_ranges x WHERE x.run_id = r.run_id) AS frames_range,
       EXISTS (SELECT 1 FROM python_functions x WHERE x.run_id = r.run_id
               AND starts_with(x.name, 'nn.Module: ')) AS frames_module
FROM runs r WHERE list_contains($ids, r.run_id)
"""
CONTENTS = ("kernels", "memory", "metrics", "steps", "frames_op", "frames_range", "frames_module")


def run_contents(store: Store, run_ids: list[str]) -> dict[str, frozenset[str]]:
    """Per run, which of CONTENTS it has rows of."""
    return {row[0]: frozenset(c for c, has in zip(CONTENTS, row[1:]) if has)
            for row in store.sql(_CONTENTS_SQL, {"ids": list(run_ids)}).fetchall()}


def run_page(store: Store, run: dict, result: CheckResult, max_ops: int,
             has: frozenset[str] = frozenset(CONTENTS), shared: dict | None = None) -> dict:
    """Everything one run's page shows; `has` (`run_contents`) what the run holds rows of, and
    `shared` the parts computed for many runs at once (`code`: `code_tree`, `step_budgets`:
    `step_budgets_of`), when they were."""
    shared = shared or {}
    rid = run["run_id"]
    findings = [f for f in result.findings if f["run_id"] == rid]
    kernels_all = summary.top_kernels(store, rid, 10**9)
    counts = summary.kernel_counts(store, rid)
    copies = summary.copies_by_device(store, rid)
    memory = "memory" in has
    mem = html_metrics.memory(store, rid, run.get("start_ns"), findings) if memory else None
    return {
        "run": run,
        "findings": findings,
        "step_budgets": shared["step_budgets"] if "step_budgets" in shared
        else step_budgets_of(store, rid) if "steps" in has else {},
        # one per root cause, each with the findings that saw the same time
        "headlines": [(f, result.related(f)) for f in result.headlines(rid)],
        "outcomes": [o for o in result.outcomes if o["run_id"] == rid],
        "not_run": result.not_run(rid),
        "devices": store.sql("SELECT device_id, name FROM devices WHERE run_id = ? ORDER BY device_id", [rid]).fetchall(),
        "busy": summary.busy(store, rid).to_dict("records"),
        "top_kernels": kernels_all.head(TOP_KERNELS).to_dict("records"),
        "kernel_totals": {**counts, "launches": int(kernels_all["count"].sum()) if len(kernels_all) else 0,
                          "total_ns": _num(kernels_all["total_ns"].sum()) if len(kernels_all) else None,
                          "untimed": store.sql("SELECT count(*) FROM kernels WHERE run_id = ?", [rid]).fetchall()[0][0]},
        "copy_totals": {"count": sum(c["count"] for c in copies),
                        "total_ns": sum(c["total_ns"] or 0 for c in copies) if copies else None,
                        "bytes": sum(c["bytes"] or 0 for c in copies) if copies else None,
                        "devices": copies},
        "memory": mem,
        "memory_rows": summary.memory(store, rid) if memory else [],
        "memory_categories": html_metrics.memory_categories(store, rid, run.get("start_ns")) if memory else [],
        "segment_maps": html_metrics.segment_map(store, rid) if memory else [],
        "timeline": html_timeline.timeline_data(store, rid, findings, run.get("start_ns"), max_ops=max_ops),
        "roofline": html_metrics.roofline(store, rid, findings),
        "stalls": html_metrics.stalls(store, rid, findings) if "metrics" in has else None,
        "code": shared["code"] if "code" in shared else code_tree(store, rid),
    }


CODE_DEPTH, CODE_ROWS = 4, 40  # the "where in the code" table: levels of the tree, rows with GPU time


def code_tree(store: Store, rid: str) -> dict | None:
    """`ranges.run_ranges` of the first of operators, NVTX ranges and modules that launched GPU
    time in the run (None: none did), down to CODE_DEPTH levels."""
    return code_trees(store, [rid])[rid]


def code_trees(store: Store, run_ids: list[str], has: dict[str, frozenset[str]] | None = None) -> dict[str, dict | None]:
    """`code_tree` of each run, each source's trees of all the runs in a few queries (`ranges.runs_ranges`);
    `has` (`run_contents`) leaves out the runs without kernels, or without frames of a source."""
    has = has if has is not None else run_contents(store, run_ids)
    out: dict[str, dict | None] = dict.fromkeys(run_ids)
    left = [r for r in run_ids if "kernels" in has[r]]
    for by in ("op", "range", "module"):
        trees = ranges.runs_ranges(store, [r for r in left if f"frames_{by}" in has[r]], by, CODE_DEPTH)
        for rid, r in trees.items():
            if any(x["gpu_ns"] for x in r["ranges"]):
                out[rid] = r
        left = [r for r in left if out[r] is None]
    return out


# -- rendering -------------------------------------------------------------------------

def render(store: Store, result: CheckResult, *, title: str | None = None,
           max_ops: int = html_timeline.MAX_OPS_DEFAULT) -> str:
    ids = [run["run_id"] for run in result.runs]
    has = run_contents(store, ids)
    code = code_trees(store, ids, has)
    steps = step_budgets_of_runs(store, [r for r in ids if "steps" in has[r]])
    pages = [run_page(store, run, result, max_ops, has[rid], {"code": code[rid], "step_budgets": steps.get(rid, {})})
             for rid, run in zip(ids, result.runs)]
    multi = len(pages) > 1
    title = title or ("traceanalyzer report: " + (pages[0]["run"]["file_name"] if len(pages) == 1
                                                  else f"{len(pages)} runs"))
    rules = {r.id: r for r in all_rules()}
    body = [f'<header class="top"><h1>{esc(title)}</h1><p class="meta">{_counts_line(result)} · '
            f'generated {esc(_dt.datetime.now().strftime("%Y-%m-%d %H:%M"))} by traceanalyzer {esc(__version__)}</p></header>']
    for e in result.errors:
        body.append(f'<p class="input-error">input error: {esc(e.path)}: {esc(e.message)}</p>')
    if multi:
        body.append(_index(pages, result))
    if not pages:
        body.append('<p class="empty">No runs.</p>')
    data_blocks = []
    for p in pages:
        body.append(_run_section(p, rules, multi))
        if p["timeline"]:
            tl = dict(p["timeline"])
            cards = _card_ids(p["headlines"])
            tl["findings"] = [{"rule": f["rule_id"], "sev": f["severity"], "msg": clip(f["message"], 600),
                               "card": cards.get(id(f))} for f in p["findings"]]
            data_blocks.append(f'<script type="application/json" id="tl-{esc(p["run"]["run_id"])}">{json_block(tl)}</script>')
    return page(title, body, data_blocks, multi)


def page(title: str, body: list[str], data_blocks: tuple[str, ...] | list[str] = (), multi: bool = False) -> str:
    """The HTML file around `body` (HTML fragments) and the JSON `data_blocks`: the inlined
    styles and script, and the policy that allows nothing else."""
    css, js = asset("report.css"), asset("report.js")
    csp = (f"default-src 'none'; script-src {_csp_hash(js)}; style-src {_csp_hash(css)}; "
           "img-src 'none'; connect-src 'none'; form-action 'none'; base-uri 'none'")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{css}</style></head>\n"
            f'<body class="{"multi" if multi else "single"}">\n' + "\n".join(body) + "\n"
            + "\n".join(data_blocks) + f"\n<script>{js}</script>\n</body></html>\n")


def _counts_line(result: CheckResult) -> str:
    c = result.counts()
    return (f"{len(result.runs)} run(s): " + ", ".join(
        f'<span class="sevtxt sev-{s}">{c[s]} {s}</span>' for s in SEVERITY_ORDER))


def _run_anchor(run: dict) -> str:
    return f"run-{esc(run['run_id'])}"


def run_loss(result: CheckResult, run_id: str) -> int:
    """The estimated loss of a run: its headline findings' (no nanosecond counted twice)."""
    return sum(f.get("est_loss_ns") or 0 for f in result.headlines(run_id))


INDEX_NAME_CHARS = 110  # longer file names lose their middle in the index (three lines hold about this many)


def _breakable(name: str) -> str:
    """A file name for the index: past `INDEX_NAME_CHARS` its middle cut out (its start and its
    end tell runs apart), escaped, with break opportunities after its separators so that it
    wraps at `__`, `_`, `.` or `-` rather than anywhere."""
    if len(name) > INDEX_NAME_CHARS:
        head = INDEX_NAME_CHARS * 2 // 5
        name = name[:head] + "…" + name[-(INDEX_NAME_CHARS - head - 1):]
    return re.sub(r"([_.\-/]+)", r"\1<wbr>", esc(name))


def _busy(busy: list[dict]) -> str:
    """The GPUs' busy shares, as a range past two GPUs."""
    if len(busy) > 2:
        shares = [b["busy_share"] for b in busy if b["busy_share"] is not None]
        return f"{len(busy)} GPUs " + (f"{100 * min(shares):.0f}–{100 * max(shares):.0f}%" if shares else "-")
    return "; ".join(f"GPU {b['device_id']} {fmt.pct(b['busy_share'])}" for b in busy) or "-"


def _index(pages: list[dict], result: CheckResult) -> str:
    """A row per run, the run that loses the largest share of its time first (`model.run_order`).
    A fixed layout, names wrapped within three lines and each worst finding on one line keep the
    rows short however long the names and messages are; the full text is in each cell's title."""
    def order(p):
        rid = p["run"]["run_id"]
        share, upper = loss_shares(result.headlines(rid), p["run"].get("budget") or [])
        return run_order(share, run_loss(result, rid), result.counts(rid), p["run"]["file_name"], upper)

    rows = []
    for p in sorted(pages, key=order):
        run = p["run"]
        c = result.counts(run["run_id"])
        loss = run_loss(result, run["run_id"])
        share, upper = loss_shares(result.headlines(run["run_id"]), run.get("budget") or [])
        said = [f"{esc(fmt.pct(share))} of a GPU's time"] if share is not None else []
        said += [f"up to {esc(fmt.pct(upper))} more if kernels ran faster (upper bounds)"] if upper is not None else []
        of_gpu = f'<div class="rid">{"; ".join(said)}</div>' if said else ""
        worst = [f for f, _ in p["headlines"][:3]]
        busy = _busy(p["busy"])
        every = "; ".join(f"GPU {b['device_id']} {fmt.pct(b['busy_share'])}" for b in p["busy"]) or "-"
        gpus = ", ".join(sorted({n for _, n in p["devices"] if n})) or "-"
        worst_html = "".join(
            f'<li title="{esc(f["rule_id"])} {esc(f["message"])}"><span class="badge sev-{f["severity"]}">'
            f'{f["severity"]}</span> <b>{esc(f["rule_id"])}</b> {esc(clip(f["message"], 160))}</li>'
            for f in worst) or '<li class="quiet">no findings</li>'
        rows.append(
            f'<tr><td class="name"><a class="clamp" href="#{_run_anchor(run)}" title="{esc(run["file_name"])}">'
            f'{_breakable(run["file_name"])}</a><div class="rid">{esc(run["run_id"])} · {esc(run["format"])}</div></td>'
            f'<td><div class="clamp" title="{esc(gpus)}">{esc(gpus)}</div></td>'
            f'<td>{esc(fmt.ns(run.get("span_ns")))}</td><td><div class="clamp" title="{esc(every)}">{esc(busy)}</div></td>'
            f'<td class="loss">{esc(fmt.ns(loss)) if loss else "-"}{of_gpu}</td>'
            + "".join(f'<td class="n"><span class="count sev-{s}{" zero" if not c[s] else ""}">{c[s]}</span></td>'
                      for s in SEVERITY_ORDER)
            + f'<td><ul class="worst">{worst_html}</ul></td></tr>')
    cols = "".join(f'<col class="c-{c}">' for c in ("run", "gpu", "span", "busy", "loss", "n", "n", "n", "worst"))
    return ('<section id="index" class="index"><h2>Runs</h2>'
            "<p class=\"quiet\">The largest share of a GPU's time lost first.</p>"
            f'<table class="runs"><colgroup>{cols}</colgroup><thead><tr><th>run</th>'
            '<th>GPU</th><th>span</th><th>GPU busy</th><th>est. loss</th><th>errors</th><th>warnings</th><th>info</th>'
            '<th>worst findings</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table></section>")


def _run_section(p: dict, rules: dict, multi: bool) -> str:
    run = p["run"]
    rid = run["run_id"]
    out = [f'<section class="run" id="{_run_anchor(run)}" data-run="{esc(rid)}">']
    if multi:
        out.append('<p class="back"><a href="#index">← all runs</a></p>')
    out.append(f'<h2>{esc(run["file_name"])}</h2>')
    meta = [f"run {esc(rid)}", esc(run["format"])]
    if run.get("producer_version"):
        meta.append(f'{esc(run.get("producer") or "")} {esc(run["producer_version"])}'.strip())
    if run.get("host"):
        meta.append(f'host: {esc(run["host"])}')
    if run.get("rank") is not None:
        meta.append(f'rank {esc(run["rank"])} of {esc(run.get("world_size") or "?")}')
    out.append(f'<p class="meta">{" · ".join(meta)}</p><p class="meta path">{esc(run.get("source_path"))}</p>')
    if run.get("warnings"):
        out.append('<details class="warnings"><summary>' + f'{len(run["warnings"])} reader warning(s)</summary><ul>'
                   + "".join(f"<li>{esc(w)}</li>" for w in run["warnings"]) + "</ul></details>")
    out.append(_budget(run, p["step_budgets"]))
    out.append(_summary_cards(p))
    out.append(_timeline(p))
    out.append(_findings(p, rules))
    out.append(_hot_kernels(run))
    out.append(_where_in_code(p["code"]))
    out.append(_plots(p))
    out.append("</section>")
    return "\n".join(out)


def _budget(run: dict, step_budgets: dict) -> str:
    """Where each device's time went (report/budget.py): its line and a stacked bar (SVG: the
    page's policy allows no inline style), parts in the order of the line; then, when the run
    has steps, a bar per step (folded)."""
    budget = run.get("budget") or []
    bare = without_kernels_line(run.get("without_kernels"))
    bare_html = f'<p class="budget">{esc(bare)}</p>' if bare else ""
    if not budget:
        return f'<p class="budget quiet">{esc(no_budget_line(run))}</p>' + bare_html
    rows = []
    for d in budget:
        rects = _stacked(d["parts"], d["span_ns"] or 0, 0, 1000, horizontal=True, one_stream=bool(d.get("one_stream")))
        warm = warmup_line(d)
        rows.append(f'<div class="budget"><div class="line">{esc(budget_line(d))}</div>'
                    + (f'<div class="line quiet">{esc(warm)}</div>' if warm else "")
                    + f'<svg viewBox="0 0 1000 16" preserveAspectRatio="none" role="img" '
                    f'aria-label="{esc(budget_line(d))}">{"".join(rects)}</svg>'
                    + _step_bars(step_budgets.get(d["device_id"]) or [], bool(d.get("one_stream"))) + "</div>")
    return '<div class="budgets">' + "".join(rows) + "</div>" + bare_html


STEP_BARS_MAX = 400  # steps drawn per device; past that, the first ones


def _step_bars(steps: list[dict], one_stream: bool = False) -> str:
    """One column per step, its parts stacked from the top in the order of the line."""
    if not steps:
        return ""
    shown = steps[:STEP_BARS_MAX]
    width = 1000 / len(shown)
    cols = []
    for i, st in enumerate(shown):
        rects = _stacked(st["parts"], st["span_ns"] or 0, i * width, width * 0.85, horizontal=False,
                         prefix=f'{st["step"]} ({fmt.ns(st["span_ns"])}): ', one_stream=one_stream)
        cols.append("".join(rects))
    more = f", the first {len(shown)} drawn" if len(steps) > len(shown) else ""
    return (f'<details class="steps"><summary>per step: {len(steps)} step(s){more}, median '
            f'{esc(fmt.ns(sorted(s["span_ns"] for s in steps)[len(steps) // 2]))}</summary>'
            f'<svg viewBox="0 0 1000 60" preserveAspectRatio="none" role="img" aria-label="time budget per step">'
            f'{"".join(cols)}</svg></details>')


def _stacked(parts: list[dict], span: int, at: float, thickness: float, *, horizontal: bool,
             prefix: str = "", one_stream: bool = False) -> list[str]:
    """SVG rects of `parts` stacked along a bar of length 1000 (horizontal, 16 high) or 60
    (vertical, `thickness` wide at x = `at`); a cause named as the budget line names it."""
    length = 1000 if horizontal else 60
    pos, rects = 0.0, []
    for part in parts:
        if not span or part["ns"] <= 0:
            continue
        size = length * part["ns"] / span
        label = cause_words(part["cause"], one_stream) if part["cause"] else part["category"]
        box = (f'x="{pos:.2f}" y="0" width="{size:.2f}" height="16"' if horizontal
               else f'x="{at:.2f}" y="{pos:.2f}" width="{thickness:.2f}" height="{size:.2f}"')
        rects.append(f'<rect class="b-{esc(part["category"])}{" c-" + esc(part["cause"]) if part["cause"] else ""}" '
                     f'{box}><title>{esc(prefix)}{esc(label)}: '
                     f'{esc(fmt.ns(part["ns"]))} ({esc(fmt.pct(part["ns"] / span))})</title></rect>')
        pos += size
    return rects


def _card(label: str, value: str, detail: str = "") -> str:
    return (f'<div class="card"><div class="label">{esc(label)}</div><div class="value">{value}</div>'
            + (f'<div class="detail">{detail}</div>' if detail else "") + "</div>")


def _kernel_names(names: int, base_names: int) -> str:
    """'41 distinct names (15 base names)': what a kernel total counts, as the summary says it."""
    def n(k: int, what: str) -> str:
        return f"{fmt.num(k)} {what}{'' if k == 1 else 's'}"

    return n(names, "distinct name") + (f" ({n(base_names, 'base name')})" if base_names != names else "")


def _summed_over(devices: int) -> str:
    return f", summed over {devices} GPUs" if devices > 1 else ""


def _summary_cards(p: dict) -> str:
    run, kt, ct = p["run"], p["kernel_totals"], p["copy_totals"]
    cards = [_card("span", esc(fmt.ns(run.get("span_ns"))) if run.get("span_ns") is not None else "no timeline",
                   esc(", ".join(sorted({n for _, n in p["devices"] if n})) or "device not named"))]
    if p["busy"]:
        main = max(p["busy"], key=lambda b: b["busy_ns"] or 0)
        split = {d["device_id"]: busy_split(d) for d in p["run"].get("budget") or []}

        def of_busy(device_id) -> str:  # busy is not all kernels: copies and memsets apart
            parts = split.get(device_id)
            return "" if not parts else " (" + ", ".join(f"{k} {fmt.ns(v)}" for k, v in parts.items() if v) + ")"

        detail = "<br>".join(f"GPU {esc(b['device_id'])}: {esc(fmt.ns(b['busy_ns']))} busy{esc(of_busy(b['device_id']))}, "
                             f"{esc(fmt.pct(b['busy_share']))} of its active span, "
                             f"{esc(fmt.pct(b['busy_share_of_run']))} of the run" for b in p["busy"])
        cards.append(_card("GPU busy", esc(fmt.pct(main["busy_share"])), detail))
    if kt["launches"]:
        # Worded as the summary's kernel table: launches, and the distinct names they ran.
        cards.append(_card("kernel time", esc(fmt.ns(kt["total_ns"])),
                           esc(f'{fmt.num(kt["launches"])} launches, {_kernel_names(kt["names"], kt["base_names"])}'
                               + _summed_over(kt["devices"]))))
    else:
        cards.append(_card("kernel time", "-", f'{esc(fmt.num(kt["untimed"]))} kernel launches, none with a duration'
                           if kt["untimed"] else "no kernels in this trace"))
    if ct["count"]:
        # Beside the run's span: a total over several devices says so, and what each had.
        per_device = ct["devices"]
        detail = f'{fmt.num(ct["count"])} copies, {fmt.nbytes(ct["bytes"])}' + _summed_over(len(per_device))
        if len(per_device) > 1:
            detail += ": " + ", ".join(f'GPU {fmt.text(c["device_id"], "?")} {fmt.ns(c["total_ns"])}' for c in per_device)
        cards.append(_card("copy time", esc(fmt.ns(ct["total_ns"])), esc(detail)))
    else:
        cards.append(_card("copy time", "-", "no copies in this trace"))
    mem, rows = p["memory"], [r for r in p["memory_rows"] if r["peak_allocated_bytes"] is not None]
    if mem:
        gpus = [s for s in mem["series"] if s["device_type"] == "cuda"] or mem["series"]
        top = max(gpus, key=lambda s: s["peak_bytes"] or 0)
        detail = "<br>".join(f'{esc(_mem_dev(s))}: {esc(fmt.nbytes(s["peak_bytes"]))} at {esc(fmt.ns(s["peak_at_ns"]))}'
                             for s in mem["series"])
        cards.append(_card("peak memory", esc(fmt.nbytes(top["peak_bytes"])), detail))
    elif rows:  # a memory timeline: its peak and what held it
        top = max(rows, key=lambda r: r["peak_allocated_bytes"])
        detail = "<br>".join(
            f'GPU {esc(r["device_id"])}: {esc(fmt.nbytes(r["peak_allocated_bytes"]))}'
            + "".join(f', {esc(c["category"].replace("_", " "))} {esc(fmt.pct(c["share"]))}' for c in (r["categories"] or [])[:2])
            for r in rows)
        cards.append(_card("peak memory", esc(fmt.nbytes(top["peak_allocated_bytes"])), detail))
    else:
        cards.append(_card("peak memory", "-", "no allocator events in this trace"))
    snap = [r for r in p["memory_rows"] if r["reserved_bytes"] is not None]
    if snap:  # a snapshot: the allocator's state when it was taken
        cards.append(_card("at the snapshot", esc(fmt.nbytes(sum(r["reserved_bytes"] for r in snap))) + " reserved",
                           "<br>".join(f'GPU {esc(r["device_id"])}: {esc(fmt.nbytes(r["allocated_bytes"]))} allocated, '
                                       f'largest free block {esc(fmt.nbytes(r["largest_free_block_bytes"]))}'
                                       for r in snap)))
    c = {s: sum(1 for f, _ in p["headlines"] if f["severity"] == s) for s in SEVERITY_ORDER}
    cards.append(_card("findings", " ".join(f'<span class="count sev-{s}{" zero" if not c[s] else ""}">{c[s]}</span>'
                                            for s in SEVERITY_ORDER), "error · warning · info"))
    return '<div class="cards">' + "".join(cards) + "</div>"


def _mem_dev(s: dict) -> str:
    if s["device_type"] == "cuda":
        return f"GPU {s['device_id']}"
    return str(s["device_type"]).upper() + ("" if s["device_id"] is None or s["device_id"] < 0 else f" {s['device_id']}")


# -- findings --------------------------------------------------------------------------

def _findings(p: dict, rules: dict) -> str:
    """Findings in the store's order: by estimated loss, largest first. Past `SHOWN_PER_RULE`
    of one rule and severity the rest are folded where the last shown one stands, and so are a
    busy run's info findings after its last warning or error (the smallest), so the plots stay
    within reach."""
    run = p["run"]
    rid = run["run_id"]
    t_origin = run.get("start_ns") or 0
    has_tl = p["timeline"] is not None
    out = ['<h3>Findings</h3>']
    if not p["findings"]:
        out.append('<p class="quiet">No findings: the rules that apply found nothing to report.</p>')
    heads = p["headlines"]
    if heads:
        c = {s: sum(1 for f, _ in heads if f["severity"] == s) for s in SEVERITY_ORDER}
        out.append('<p class="quiet">' + ", ".join(f'<span class="sevtxt sev-{s}">{c[s]} {s}</span>'
                                                  for s in SEVERITY_ORDER if c[s]) + " · largest estimated loss first</p>")
    last_loud = max((i for i, (f, _) in enumerate(heads) if f["severity"] != "info"), default=-1)
    fold_tail = len(heads) > FOLD_INFO_OVER and last_loud < len(heads) - 1
    shown, tail = [], []
    seen: dict[tuple, int] = {}
    more: dict[tuple, list[str]] = {}  # (rule, severity) -> the cards past SHOWN_PER_RULE
    for i, (f, related) in enumerate(heads):
        into = tail if fold_tail and i > last_loud else shown
        key = (f["rule_id"], f["severity"], into is tail)
        seen[key] = seen.get(key, 0) + 1
        card = _finding_card(i, f, rules, rid, t_origin, has_tl, related)
        if seen[key] <= SHOWN_PER_RULE:
            into.append(card)
            continue
        if key not in more:
            more[key] = []
            into.append(key)  # where its folded cards go
        more[key].append(card)

    def placed(items: list) -> list[str]:
        return [x if isinstance(x, str) else
                f'<details class="more"><summary>{len(more[x])} more {esc(x[0])} {x[1]} finding(s)</summary>'
                + "".join(more[x]) + "</details>" for x in items]

    out += placed(shown)
    if tail:
        out.append(f'<details class="infos"><summary class="sevtxt sev-info">{len(heads) - last_loud - 1} more info '
                   f'(smaller losses)</summary>')
        out += placed(tail) + ["</details>"]
    # A rule that failed is a failure of the check, in plain sight (not folded).
    out += [f'<p class="input-error">rule error: {esc(o["rule_id"])}: {esc(o["note"])}</p>'
            for o in p["outcomes"] if o["status"] == "error"]
    skipped = [o for o in p["outcomes"] if o["status"] == "no-data"]
    if skipped:
        out.append('<details class="outcomes"><summary>' + f'{len(skipped)} rule(s) did not run on this trace</summary><ul>'
                   + "".join(f'<li><b>{esc(o["rule_id"])}</b> not applicable: '
                             f'{esc(o["note"])}</li>' for o in skipped) + "</ul></details>")
    if p["not_run"]:
        out.append(f'<p class="outcomes">{len(p["not_run"])} rule(s) not run on this trace (not selected when '
                   f'it was checked): {esc(", ".join(p["not_run"]))}</p>')
    return "\n".join(out)


def _card_ids(headlines: list[tuple[dict, list[dict]]]) -> dict[int, str]:
    """id(finding) -> its card's id after `f-<run>-` (`_findings`): a headline's index, a related
    finding's `<headline index>-<k>`: what a timeline marker opens."""
    out = {}
    for i, (f, related) in enumerate(headlines):
        out[id(f)] = str(i)
        out.update((id(r), f"{i}-{k}") for k, r in enumerate(related))
    return out


def _finding_card(i: int, f: dict, rules: dict, rid: str, t_origin: int, has_tl: bool,
                  related: list[dict] = ()) -> str:
    """One finding; a headline's related findings (the same root cause, seen by other rules)
    folded inside it, each with its own details and the rule's own estimate, no second loss."""
    sev = f["severity"]
    rule = rules.get(f["rule_id"])
    where = _where(f, t_origin)
    zoom = (f' <button class="zoom" data-run="{esc(rid)}" data-s="{f["start_ns"] - t_origin}" '
            f'data-e="{(f["end_ns"] if f["end_ns"] is not None else f["start_ns"]) - t_origin}">show in timeline</button>'
            if has_tl and f.get("start_ns") is not None else "")
    loss = f'<span class="loss">est. loss {esc(fmt.ns(f["est_loss_ns"]))}</span>' if f.get("est_loss_ns") else ""
    if f.get("related_to") is not None and f.get("rule_loss_ns"):
        loss = f'<span class="loss quiet">{esc(fmt.related_estimate(f["rule_loss_ns"], f.get("claims"), "the headline"))}</span>'
    return (f'<article class="finding sev-{sev}" id="f-{esc(rid)}-{i}"><header>'
            f'<span class="badge sev-{sev}">{sev}</span> <b>{esc(f["rule_id"])}</b> '
            f'<span class="rtitle">{esc(rule.title if rule else "")}</span>{loss}</header>'
            f'<p class="msg">{esc(f["message"])}</p>'
            + (f'<p class="hint"><b>Hint:</b> {esc(f["hint"])}</p>' if f.get("hint") else "")
            + (f'<p class="where">NVIDIA: {esc(vendor_text(f["vendor"]))}</p>' if f.get("vendor") else "")
            + (f'<p class="where">{where}{zoom}</p>' if where or zoom else "")
            + _evidence(f.get("evidence"), rid, t_origin, has_tl)
            + _related(i, related, rules, rid, t_origin, has_tl)
            + "</article>")


def _related(i: int, related: list[dict], rules: dict, rid: str, t_origin: int, has_tl: bool) -> str:
    if not related:
        return ""
    cards = "".join(_finding_card(f"{i}-{k}", r, rules, rid, t_origin, has_tl) for k, r in enumerate(related))
    return (f'<details class="related"><summary>{len(related)} related finding(s) of the same root cause: '
            f'{esc(", ".join(dict.fromkeys(r["rule_id"] for r in related)))}</summary>{cards}</details>')


def _where(f: dict, t_origin: int) -> str:
    parts = []
    if f.get("device_id") is not None:
        parts.append(f"device {esc(f['device_id'])}")
    if f.get("stream_id") is not None:
        parts.append(f"stream {esc(f['stream_id'])}")
    if f.get("item_kind") in ("kernel", "copy", "memset", "range", "cpu_op", "memory") and f.get("item_id") is not None:
        name = f" <code>{esc(clip(f['item_name'], 120))}</code>" if f.get("item_name") else ""
        parts.append(f"{esc(f['item_kind'])} #{esc(f['item_id'])}{name}")
    if f.get("start_ns") is not None:
        parts.append(esc(fmt.place(f["start_ns"], f.get("end_ns"), t_origin, place_of(f))))
    if f.get("value") is not None:
        thr = f" (threshold {esc(_value(f['threshold'], f.get('value_unit')))})" if f.get("threshold") is not None else ""
        parts.append(f"value {esc(_value(f['value'], f.get('value_unit')))}{thr}")
    return " · ".join(parts)


def _value(v, unit) -> str:
    if unit == "ns":
        return fmt.ns(v)
    if unit == "share":
        return fmt.pct(v)
    if unit == "bytes":
        return fmt.nbytes(v)
    return f"{fmt.num(v)} {unit}" if unit else fmt.num(v)


def _scalar(key: str, v, t_origin: int) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return esc(clip(v, 300) if isinstance(v, str) else json.dumps(v, ensure_ascii=False)[:300])
    k = key.lower()
    if k in ("start_ns", "end_ns", "ts_ns") or k.endswith(("_start_ns", "_end_ns", "_at_ns")):  # a time, not a length
        return f'<span title="{esc(v)} ns on the run clock">{esc(fmt.ns(v - t_origin))}</span>'
    if k.endswith("_ns") or k == "ns":
        return f'<span title="{esc(v)} ns">{esc(fmt.ns(v))}</span>'
    if k.endswith("bytes") or k == "bytes":
        return f'<span title="{esc(v)} bytes">{esc(fmt.nbytes(v))}</span>'
    if k.endswith("share") or k in ("theoretical", "achieved", "last_fill"):
        return esc(fmt.pct(v)) if isinstance(v, float) and abs(v) <= 1 else esc(fmt.num(v))
    return esc(fmt.num(v))


def _evidence(ev, rid: str, t_origin: int, has_tl: bool) -> str:
    if not ev:
        return ""
    return ('<details class="evidence"><summary>evidence</summary>' + _ev_value("", ev, rid, t_origin, has_tl, 0)
            + "</details>")


def _ev_value(key: str, v, rid: str, t_origin: int, has_tl: bool, depth: int) -> str:
    if isinstance(v, dict):
        if depth > 3:
            return f"<code>{esc(clip(json.dumps(v, ensure_ascii=False), 300))}</code>"
        # the values of a `*_ns` mapping ({cause: ns}) are times as its own are
        as_ns = key.lower().endswith("_ns")
        rows = "".join(f"<tr><th>{esc(k)}</th><td>"
                       f"{_ev_value(f'{k}_ns' if as_ns and not k.endswith('_ns') else k, x, rid, t_origin, has_tl, depth + 1)}"
                       f"</td></tr>" for k, x in v.items())
        return f'<table class="ev">{rows}</table>'
    if isinstance(v, list):
        if v and all(isinstance(x, dict) for x in v):
            cols = list(dict.fromkeys(k for x in v for k in x))[:14]
            ranged = has_tl and all("start_ns" in x and "end_ns" in x for x in v)
            head = "".join(f"<th>{esc(c)}</th>" for c in cols) + ("<th></th>" if ranged else "")
            body = []
            for x in v[:MAX_EVIDENCE_ROWS]:
                cells = "".join(f"<td>{_ev_value(c, x.get(c), rid, t_origin, has_tl, depth + 1)}</td>" for c in cols)
                if ranged and isinstance(x.get("start_ns"), (int, float)) and isinstance(x.get("end_ns"), (int, float)):
                    cells += (f'<td><button class="zoom small" data-run="{esc(rid)}" data-s="{x["start_ns"] - t_origin}" '
                              f'data-e="{x["end_ns"] - t_origin}" title="show in timeline">⌖</button></td>')
                body.append(f"<tr>{cells}</tr>")
            more = f'<p class="quiet">{len(v) - MAX_EVIDENCE_ROWS} more not shown</p>' if len(v) > MAX_EVIDENCE_ROWS else ""
            return f'<table class="ev list"><tr>{head}</tr>{"".join(body)}</table>{more}'
        return esc(", ".join(clip(x, 120) if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in v[:50]))
    return _scalar(key, v, t_origin)


# -- plots -----------------------------------------------------------------------------

def _hot_kernels(run: dict) -> str:
    """A timeline linked to Nsight Compute: each hot kernel's four passes (report/passes.py); "" otherwise."""
    from .passes import lines

    if not run.get("hot_kernels"):
        return ""
    links = "; ".join(f"ncu run {s['ncu_run_id']}: {s['both']} launch(es) matched, {s['ncu']} ncu launch(es) and "
                      f"{s['timeline']} timeline configuration(s) unmatched" for s in run.get("links", []))
    out = ['<h3>Hot kernels: timeline and Nsight Compute together</h3>', f'<p class="quiet">{esc(links)}</p>']
    for k in run["hot_kernels"]:
        rows = "".join(f"<tr><th>{esc(what)}</th><td>{esc(text)}</td></tr>" for what, text in lines(k))
        out.append(f'<h4 title="{esc(k["name"])}">{esc(k["label"])}</h4><table class="ev">{rows}</table>')
    return "\n".join(out)


def _where_in_code(r: dict | None) -> str:
    """The tree of `code_tree` as a table: the paths that launched GPU time, in tree order, each
    name indented by its depth (`traceanalyzer ranges` lists them all)."""
    if r is None:
        return ""
    what = ranges.WHAT[r["by"]]
    rows = [x for x in r["ranges"] if x["gpu_ns"]][:CODE_ROWS]
    body = "".join(
        f'<tr><td>{"&nbsp;" * 4 * x["depth"]}{esc(clip(x["name"], 80))}</td><td>{fmt.num(x["instances"])}</td>'
        f'<td>{fmt.num(x["kernels"])}</td><td>{fmt.ns(x["gpu_ns"])}</td><td>{fmt.ns(x["gpu_proj_ns"])}</td>'
        f'<td>{fmt.pct(x["share"])}</td></tr>' for x in rows)
    note = (f"GPU time by the {what} that launched it (children included), {CODE_DEPTH} levels deep; "
            f"{fmt.ns(r['outside_ns'])} of kernel time was launched outside every {what[:-1]}. "
            "`traceanalyzer ranges` lists every path.")
    return (f'<h3>Where in the code</h3><p class="quiet">{esc(note)}</p><table class="ev"><tr><th>{what[:-1]}</th>'
            "<th>instances</th><th>kernels</th><th>GPU time</th><th>GPU projection</th><th>share</th></tr>"
            f"{body}</table>")


def _timeline(p: dict) -> str:
    tl = p["timeline"]
    if not tl:
        return ""
    note = (f"{tl['total_ops']:,} GPU operations, the {tl['shown_ops']:,} longest drawn one by one; the shading of each "
            f"track shows the busy share of all of them" if tl["sampled"] else f"{tl['total_ops']:,} GPU operations")
    return (f'<h3>Timeline</h3><p class="quiet">{esc(note)}. Wheel to zoom, drag to pan, double-click to reset; '
            'findings are marked in the top row and on their tracks (click one to see it below).</p>'
            f'<div class="timeline" data-run="{esc(p["run"]["run_id"])}"></div>')


def _plots(p: dict) -> str:
    out = []
    if p["top_kernels"]:
        out.append("<h3>Top kernels by total time, by base name</h3>" + charts.top_kernels(p["top_kernels"]))
    for rf in p["roofline"]:
        out.append(f'<h3>Roofline</h3><p class="quiet">{esc(_roofline_note(rf))}</p>' + charts.roofline(rf))
    st = p["stalls"]
    if st:
        note = ("Share of stall cycles by reason (Nsight Compute warp-state metrics, as rule I001 reads them); "
                "⚑ marks the kernels I001 reported.")
        if st["kernels_total"] > len(st["kernels"]):
            note += f" {len(st['kernels'])} of {st['kernels_total']} kernels shown."
        out.append(f'<h3>Warp stall reasons</h3><p class="quiet">{esc(note)}</p>'
                   + charts.stalls(st, [r for r, _, _ in REASONS]))
    mem = p["memory"]
    if mem:
        out.append('<h3>Memory</h3><p class="quiet">Allocated bytes over time (each column shows the lowest and highest '
                   'value in it); the dot marks the peak.</p>' + charts.memory(mem))
    if p["memory_categories"]:
        out.append('<h3>Memory by category</h3><p class="quiet">Device memory over time stacked by what PyTorch\'s memory '
                   'profiler says each tensor is (each column shows the time step with the most memory in it); the '
                   'dot marks the peak, the one rule M005 reports.</p>'
                   + "".join(charts.memory_categories(d) for d in p["memory_categories"]))
    if p["segment_maps"]:
        out.append('<h3>Segment map</h3><p class="quiet">The caching allocator\'s segments at the snapshot, in address '
                   'order, each a bar as long as its size (rows wrap; the scale is on top), its blocks colored by state. '
                   'Free memory beside live tensors cannot serve a request larger than its block; the largest free '
                   'block is outlined. Hover a block for its size and segment.</p>'
                   + "".join(charts.segment_map(d) for d in p["segment_maps"]))
    return "\n".join(out)


def _roofline_note(rf: dict) -> str:
    if rf["source"] == "B003":
        note = "Kernels as rule B003 placed them (the kernels over its time-share cut-off), colored by the bound it found. "
    else:
        note = ("Every kernel as B003's roofline analysis places it from the Nsight Compute metrics (the rule did "
                "not evaluate this run). ")
    if rf["mode"] == "absolute":
        if rf.get("estimate"):
            note += "FLOPs and bytes are estimates from operator input shapes (see each finding's assumptions). "
        roofs = ", ".join(r["label"] for r in rf.get("roofs", []))
        note += (f"Roofs: DRAM bandwidth and {roofs} peaks." if roofs and rf.get("bandwidth_bytes_per_s")
                 else "The device's peaks are unknown, so some roofs are missing.")
    else:
        note += ("No FLOP counts here: each kernel is placed from its Speed-of-Light shares, compute (SM) throughput "
                 "against memory throughput, both as a share of peak; on this scale the roof is the same for every GPU.")
    shown = len(rf["points"])
    if rf["kernels_total"] > shown:
        note += f" The {shown} longest of {rf['kernels_total']} kernels are shown."
    return note
