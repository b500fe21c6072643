"""Checking files: the one way a file is read into a store and its rules are run
(`check_file`), over many files (`check_paths`), linking the timeline and Nsight Compute runs
among them (`link_pairs`), and `traceanalyzer check` (`run_check`)."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import duckdb

from ..config import ConfigError, find_config, load_config, parse_threshold_option
from .. import diagnosis, interrupt, link
from ..diagnosis import diagnose_runs, store_diagnosed
from ..ingest import TraceError, find_traces, resolved
from ..report.model import Baseline, CheckResult, InputError, load_result
from ..rules import get_rule
from ..rules._ncu import linked_rule_ids
from ..rules.base import SEVERITIES
from ..rules.engine import Found, Settings, run_rules
from ..store import Store, StoreError, file_hash, one_line_error, run_id_for


class UsageError(Exception):
    pass


@dataclass
class CheckOptions:
    paths: list[str]
    fail_on: str | None = None
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    thresholds: list[str] = field(default_factory=list)  # RULE.NAME=VALUE
    config: Path | None = None
    baseline: Path | None = None
    max_growth_pct: float | None = None  # with a baseline: fail a finding grown by more
    link: bool = True  # link a timeline and an Nsight Compute run given together (`link.pairs`)
    captures: list[Path] = field(default_factory=list)  # capture-phase traces of the graph replays checked


@dataclass
class FileResult:
    """What `check_file` did with one file (and a scan with each of its files).

    `state`: `stored` (read now), `updated` (read now, replacing the stored run of the same
    content), `kept` (stored before and not read again; its rules ran), `skipped` (stored with
    the current rules' findings: nothing to do), `duplicate` (the same bytes as a file done
    before in this batch), or `failed` (`error`, one line; `internal` when it is a bug in
    traceanalyzer rather than a bad file, with the traceback in `detail`)."""

    path: str
    state: str = "failed"
    size_bytes: int = 0
    content_hash: str | None = None
    run_id: str | None = None
    format: str | None = None
    span_ns: int | None = None
    counts: dict[str, int] = field(default_factory=dict)  # rows stored, by table
    warnings: list[str] = field(default_factory=list)
    capture: str | None = None  # what merging its graph capture did (`merge_captures`), or what the
    # reader placed from the trace's own graph node events (nsys), one line
    rule_ids: list[str] = field(default_factory=list)  # the per-run rules evaluated on the run
    error: str | None = None
    internal: bool = False
    detail: str | None = None
    work_s: float = 0.0

    def fail(self, e: Exception) -> None:
        """Make this a `failed` result for the exception `e` (see `InputError.of`); call it in
        the except block, where the traceback of a bug in traceanalyzer is."""
        error = InputError.of(self.path, e)
        self.state, self.error, self.internal, self.detail = "failed", error.message, error.internal, error.detail

    @property
    def input_error(self) -> InputError | None:
        if self.state != "failed":
            return None
        return InputError(self.path, self.error or "failed", internal=self.internal, detail=self.detail)


def per_run_settings(settings: Settings) -> Settings | None:
    """The per-run part of a rule selection; None when it selects nothing."""
    ids = [r.id for r in settings.rules() if r.scope == "run"]
    return replace(settings, select=ids, ignore=[]) if ids else None


def cross_run_settings(settings: Settings) -> Settings | None:
    """The cross-run part (scope "runs": rules that need every run at once)."""
    ids = [r.id for r in settings.rules() if r.scope == "runs"]
    return replace(settings, select=ids, ignore=[]) if ids else None


def up_to_date_hashes(store: Store, settings: Settings | None) -> set[str]:
    """Content hashes of stored runs that need no work: stored, and (with rules) holding an
    outcome of every selected per-run rule with the same thresholds."""
    rules = per_run_settings(settings) if settings is not None else None
    if rules is None:
        return {r[0] for r in store.sql("SELECT content_hash FROM runs").fetchall()}
    expected = [f"{r.id}\x1f{json.dumps(rules.params_for(r), sort_keys=True)}" for r in rules.rules()]
    rows = store.sql("""
        SELECT r.content_hash FROM runs r JOIN rule_runs o USING (run_id)
        WHERE list_contains($expected, o.rule_id || chr(31) || o.params::VARCHAR)
        GROUP BY r.content_hash HAVING count(DISTINCT o.rule_id) = $n""",
                     {"expected": expected, "n": len(expected)}).fetchall()
    return {r[0] for r in rows}


def check_file(store: Store, path: str | Path, rules: Settings | None, *, read_stored: bool = False,
               up_to_date: frozenset[str] = frozenset(), hash_name: str | None = None,
               seen: dict[str, str] | None = None, captures: list[Path] | None = None,
               found: Found | None = None) -> FileResult:
    """Check one file: read it into `store` and run the per-run rules of `rules` on its run
    (None: store it only; cross-run rules run once every file is done, see `run_check`).
    Every way of checking a file goes through here: `check`, `ingest`, `report` and `diff` on
    the user's store, a scan's writer on its store, and a scan's worker on a store of its own
    whose rows it hands to the writer. The store's
    `resources` say how many CPUs the read, the store and the rules may use. Never raises
    for the file: a file that cannot be read is a `failed` result.

    A file whose content the store holds is not read again (`kept`) unless `read_stored`;
    one whose hash is in `up_to_date` (stored with the current rules' findings) is
    `skipped`; one whose hash is in `seen` (content hash -> the path done first, filled
    here) is a `duplicate`. `hash_name`: the content hash of the store the run is for
    (default: `store`'s). With `captures` (capture-phase traces of its graph replays), they are
    merged into the run before its rules run (`merge_capture`; a run that replays no graph gets
    a warning instead); a capture that holds none of its graphs fails the file. With `found`
    the rules' results go there, for the command to diagnose once its other passes ran
    (`store_diagnosed`); else the run is diagnosed and stored at once."""
    t0 = time.perf_counter()
    res = FileResult(path=str(path))
    rules = per_run_settings(rules) if rules is not None else None
    try:
        p = Path(path)
        if not p.exists():
            raise TraceError("a symbolic link that leads to no file (a loop, or a missing target)"
                             if os.path.lexists(p) else "no such file")
        res.size_bytes = p.stat().st_size
        need_hash = bool(up_to_date) or not read_stored or seen is not None
        if need_hash and p.is_file():  # else Store.ingest says what it is
            res.content_hash = file_hash(p, hash_name or store.hash_name())
            res.run_id = run_id_for(res.content_hash)
        if res.content_hash in up_to_date:
            res.state = "skipped"
        elif seen is not None and res.content_hash in seen:
            res.state, res.warnings = "duplicate", [f"same content as {seen[res.content_hash]}"]
        elif not read_stored and store.has_hash(res.content_hash):
            res.state = "kept"
        else:
            stored = store.ingest(p, content_hash=res.content_hash)
            res.state = "updated" if stored.replaced else "stored"
            res.run_id, res.content_hash = stored.run_id, stored.content_hash
            res.format, res.span_ns, res.counts = stored.format, stored.span_ns, dict(stored.counts)
            res.warnings = list(stored.warnings)
        if res.state in ("skipped", "duplicate", "kept"):
            res.format, res.span_ns, stored_warnings = _stored_run(store, res.run_id)
            if res.state == "kept":  # checked again: what its reader met, as when it was read
                res.warnings = stored_warnings
        if res.state in ("stored", "updated", "kept"):  # a run to check
            if seen is not None:
                seen.setdefault(res.content_hash, res.path)
            if captures and _replays_graphs(store, res.run_id):
                res.capture = merge_capture(store, res.run_id, captures)
            elif captures:
                res.warnings.append("no graph launch with GPU work under it: the capture was not merged")
            elif res.state != "kept":  # what the reader placed itself (nsys graph node events)
                res.capture = (_capture_note(store, res.run_id) or {}).get("line")
            if rules is not None:
                per_run_pass(store, [res.run_id], rules, found)
                res.rule_ids = [r.id for r in rules.rules()]
    except duckdb.IOException:  # the store cannot be read (damaged, cut short): no file's fault, and no file can go on
        raise
    except Exception as e:  # a reader bug must not stop the batch either
        interrupt.stop_if_interrupted(e)
        res.fail(e)
    res.work_s = time.perf_counter() - t0
    return res


def per_run_pass(store: Store, run_ids: list[str], rules: Settings, found: Found | None) -> None:
    """`rules` on `run_ids`: into `found` (diagnosed once the command's passes ran), or without
    it diagnosed and stored now (`diagnose_runs`)."""
    if found is None:
        diagnose_runs(store, run_ids, rules)
    else:
        run_rules(store, run_ids, rules, into=found)


def merge_capture(store: Store, run_id: str, captures: list[Path]) -> str:
    """Merge `captures` into run `run_id`'s graph replays (`Store.merge_capture`) unless the
    same captures (by content) are merged already; the line saying what was placed."""
    for c in map(Path, captures):
        if not c.is_file():
            raise TraceError(f"capture {c.name}: no such file" if not c.exists() else f"capture {c.name}: not a file")
    hashes = [file_hash(Path(c), store.hash_name()) for c in captures]
    note = _capture_note(store, run_id)
    if note and note.get("hashes") == hashes and note.get("line"):
        return note["line"]
    return store.merge_capture(run_id, captures, hashes=hashes).line()


def _replays_graphs(store: Store, run_id: str) -> bool:
    return store.sql("SELECT EXISTS (SELECT 1 FROM graph_replays WHERE run_id = ?)", [run_id]).fetchall()[0][0]


def _capture_note(store: Store, run_id: str) -> dict | None:
    rows = store.sql("SELECT metadata FROM runs WHERE run_id = ?", [run_id]).fetchall()
    return (json.loads(rows[0][0]) or {}).get("graph_capture") if rows and rows[0][0] else None


def merge_captures(store: Store, files: list[FileResult], captures: dict[str, list[Path]],
                   rules: Settings | None, found: Found | None = None) -> None:
    """A scan's pairs: merge into each stored run of `files` whose path `captures` lists the
    capture traces found beside it (`capture_merge.capture_files`), and run its per-run rules
    again when that changed it. A capture that holds none of its graphs is a warning on the
    file; the run stays as read. `found`: as `check_file`'s."""
    per_run = per_run_settings(rules) if rules is not None else None
    for f in files:
        caps = captures.get(f.path)
        if not caps or f.state == "failed" or not f.run_id or not _replays_graphs(store, f.run_id):
            continue  # (a trace beside the captures that replays no graph: nothing to merge)
        try:
            before = (_capture_note(store, f.run_id) or {}).get("hashes")
            f.capture = merge_capture(store, f.run_id, caps)
            if per_run is not None and (_capture_note(store, f.run_id) or {}).get("hashes") != before:
                per_run_pass(store, [f.run_id], per_run, found)
        except Exception as e:
            interrupt.stop_if_interrupted(e)
            f.warnings.append(f"capture {', '.join(Path(c).name for c in caps)} not merged: {one_line_error(e)}")


def _stored_run(store: Store, run_id: str | None) -> tuple[str | None, int | None, list[str]]:
    """A stored run's format, span and reader warnings."""
    # fetchall: DuckDB 2 refuses new work on a connection with a half-read result
    rows = store.sql("SELECT format, span_ns, warnings FROM runs WHERE run_id = ?", [run_id]).fetchall()
    return (rows[0][0], rows[0][1], list(rows[0][2] or [])) if rows else (None, None, [])


@dataclass
class Checked:
    """What `check_paths` or `runs_for` did: a result per file (or per ref that named
    nothing: `failed`), and the files a folder walk passed over because they are no traces."""

    files: list[FileResult] = field(default_factory=list)
    not_traces: list[tuple[Path, str]] = field(default_factory=list)  # (file, what it is instead)

    @property
    def run_ids(self) -> list[str]:
        return list(dict.fromkeys(f.run_id for f in self.files if f.state != "failed" and f.run_id))

    @property
    def errors(self) -> list[InputError]:
        return [f.input_error for f in self.files if f.state == "failed"]

    def add(self, res: FileResult, on_file: Callable[[FileResult], None] | None) -> None:
        self.files.append(res)
        if on_file:
            on_file(res)


def check_paths(store: Store, paths: list[str], rules: Settings | None, *, read_stored: bool = False,
                on_file: Callable[[FileResult], None] | None = None, captures: list[Path] | None = None,
                found: Found | None = None) -> Checked:
    """`check_file` on every trace under `paths`, in order, one transaction a file: a file
    that fails is a `failed` result and the rest go on. `on_file` sees each result as it
    comes. Paths that hold no trace at all are one failed result. `captures`: capture-phase
    traces merged into each file's graph replays (`check_file`); they are no files to check.
    `found`: as `check_file`'s."""
    done = Checked()
    skip = {resolved(c) for c in captures or ()}
    files = [f for f in find_traces(paths, not_traces=done.not_traces) if resolved(f) not in skip]
    if not files:
        done.add(FileResult(" ".join(map(str, paths)), error="no trace files here"), on_file)
    seen: dict[str, str] = {}
    with interrupt.watching():  # Ctrl-C is no file's error
        for f in files:
            store.let_in_waiting()  # a reader of this store gets in between two files
            done.add(check_file(store, f, rules, read_stored=read_stored, seen=seen, captures=captures,
                                found=found), on_file)
    return done


def check_refs(store: Store, refs: list[str], rules: Settings | None, *,
               on_file: Callable[[FileResult], None] | None = None, captures: list[Path] | None = None,
               found: Found | None = None) -> Checked:
    """`check_paths` on the refs that are files or folders; a ref that is neither but names a
    stored run (id, id prefix or file name) has that run's rules run again, as a stored file
    has (`kept`), after the files. A ref that names nothing is a failed result. `found`: as
    `check_file`'s."""
    paths = [ref for ref in refs if os.path.lexists(ref)]  # (a link to nothing: check_file says so)
    done = check_paths(store, paths, rules, on_file=on_file, captures=captures, found=found) if paths else Checked()
    rules = per_run_settings(rules) if rules is not None else None
    for ref in refs:
        if ref in paths:
            continue
        res = _named_run(store, ref, done, on_file)
        if res is None:
            continue
        res.state = "kept"
        if captures:
            try:
                res.capture = merge_capture(store, res.run_id, captures)
            except Exception as e:
                interrupt.stop_if_interrupted(e)
                res.fail(e)
                done.add(res, on_file)
                continue
        if rules is not None:
            per_run_pass(store, [res.run_id], rules, found)
            res.rule_ids = [r.id for r in rules.rules()]
        done.add(res, on_file)
    return done


def _named_run(store: Store, ref: str, done: Checked, on_file) -> FileResult | None:
    """The stored run `ref` names (`_stored_ref`), or None with a failed result added to `done`."""
    try:
        return _stored_ref(store, ref)
    except StoreError as e:
        done.add(FileResult(ref, error=f"no such file, and {e}"), on_file)
        return None


def runs_for(store: Store, refs: list[str], settings: Settings, *, same_rules: bool = False,
             on_file: Callable[[FileResult], None] | None = None) -> Checked:
    """The runs `refs` name, each with findings (for a report or a diff, which read them): a
    file or folder is checked as `check_paths` does, save that a stored run that was checked
    is not checked again; anything else must name a stored run (id, id prefix or file name),
    whose rules run when it was never checked. With `same_rules` (a diff, which compares the
    findings of two runs), "checked" means with every per-run rule of `settings` and the same
    thresholds; else with any (a report shows what its check found). A ref that names
    nothing is a failed result. `on_file` sees the result of each file, and each ref that
    named nothing."""
    with interrupt.watching():  # Ctrl-C is no file's error
        return _runs_for(store, refs, settings, same_rules, on_file)


def _runs_for(store: Store, refs: list[str], settings: Settings, same_rules: bool, on_file) -> Checked:
    fresh = _checked_hashes(store, settings, same_rules)
    done = Checked()
    for ref in refs:
        if Path(ref).exists():
            files = list(find_traces([ref], not_traces=done.not_traces))
            if not files:
                done.add(FileResult(ref, error="no trace files here"), on_file)
            for f in files:
                done.add(check_file(store, f, settings, up_to_date=fresh), on_file)
            continue
        res = _named_run(store, ref, done, on_file)
        if res is None:
            continue
        rules = per_run_settings(settings)
        if res.content_hash not in fresh and rules is not None:
            res.state = "kept"
            diagnose_runs(store, [res.run_id], rules)
            res.rule_ids = [r.id for r in rules.rules()]
        done.files.append(res)
    return done


def needs_writing(store: Store, refs: list[str], settings: Settings, *, same_rules: bool = False) -> bool:
    """Whether `runs_for` would write to the store: some ref is a file or folder, or names a
    stored run that was not checked (see `runs_for`)."""
    if any(Path(ref).exists() for ref in refs):
        return True
    fresh = _checked_hashes(store, settings, same_rules)
    for ref in refs:
        try:
            if _stored_ref(store, ref).content_hash not in fresh:
                return True
        except StoreError:
            continue  # an error either way, and no write
    return False


def _stored_ref(store: Store, ref: str) -> FileResult:
    """The stored run `ref` names (id, id prefix or file name), as a `skipped` result; StoreError
    when it names none or several."""
    res = FileResult(ref, "skipped", run_id=store.resolve_run(ref))
    ((res.content_hash, res.format, res.span_ns),) = store.sql(
        "SELECT content_hash, format, span_ns FROM runs WHERE run_id = ?", [res.run_id]).fetchall()
    return res


def _checked_hashes(store: Store, settings: Settings, same_rules: bool) -> frozenset[str]:
    if same_rules:
        return frozenset(up_to_date_hashes(store, settings))
    return frozenset(h for (h,) in store.sql(
        "SELECT content_hash FROM runs r WHERE EXISTS (SELECT 1 FROM rule_runs o WHERE o.run_id = r.run_id)").fetchall())


def link_pairs(store: Store, files: list[FileResult], rules: Settings | None, *, given_together: bool,
               on_link: Callable[[link.LinkResult], None] | None = None,
               found: Found | None = None) -> tuple[list[link.LinkResult], list[InputError]]:
    """Link the timeline and Nsight Compute runs of `files` that go together (`link.pairs`), and
    run the linked rules (`rules._ncu.linked_rule_ids`, of `rules`) again on each timeline run
    whose links changed or whose pair was read in this batch (its rules ran without the links:
    before the ncu run was stored, or on a scan worker's store). A pair that cannot be linked is
    an error for the ncu file; the others go on. `on_link` sees each pair linked. `found`: as
    `check_file`'s."""
    checked = [f for f in files if f.state != "failed" and f.run_id and f.format]
    paths = {f.run_id: f.path for f in checked}
    read_now = {f.run_id for f in checked if f.state in ("stored", "updated")}
    done, errors, again = [], [], []
    roles = link.run_roles(store, list(paths))
    for timeline, ncu in link.pairs([(f.path, f.run_id, roles.get(f.run_id)) for f in checked],
                                    given_together=given_together):
        try:
            res = link.link_runs(store, timeline, ncu)
        except Exception as e:  # a bug in linking must not stop the batch
            interrupt.stop_if_interrupted(e)
            error = InputError.of(paths[ncu], e)
            errors.append(InputError(error.path, f"could not link it to {paths[timeline]}: {error.message}",
                                     error.internal, error.detail))
            continue
        done.append(res)
        if on_link:
            on_link(res)
        if res.changed or {timeline, ncu} & read_now:
            again.append(timeline)
    run_linked_rules(store, list(dict.fromkeys(again)), rules, found)
    return done, errors


def run_linked_rules(store: Store, run_ids: list[str], rules: Settings | None, found: Found | None = None) -> None:
    """Run the linked rules of `rules` (those of `rules._ncu.linked_rule_ids` it selects) on the
    timeline runs `run_ids`: into `found`, or diagnosed at once with the runs' other findings."""
    per_run = per_run_settings(rules) if rules is not None else None
    selected = {r.id for r in per_run.rules()} if per_run is not None else set()
    ids = [i for i in linked_rule_ids() if i in selected]
    if run_ids and ids:
        per_run_pass(store, run_ids, replace(rules, select=ids, ignore=[]), found)


def _threshold_owner(ref: str) -> str:
    """A rule's id, or the severity floor's name (`floor`)."""
    return diagnosis.FLOOR if ref.upper() == diagnosis.FLOOR else get_rule(ref).id


def settings_from(opts: CheckOptions) -> tuple[Settings, str]:
    """Merge the config file and the command line (the command line wins)."""
    try:
        cfg = load_config(opts.config) if opts.config else find_config()
        thresholds: dict[str, dict] = {}
        for ref, values in cfg.thresholds.items():
            thresholds.setdefault(_threshold_owner(ref), {}).update(values)
        for text in opts.thresholds:
            ref, name, value = parse_threshold_option(text)
            thresholds.setdefault(_threshold_owner(ref), {})[name] = value
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except KeyError as e:
        raise UsageError(f"unknown rule {e.args[0]!r} in thresholds (see `traceanalyzer rules`)") from None
    settings = Settings(select=opts.select or cfg.select, ignore=opts.ignore or cfg.ignore, thresholds=thresholds)
    fail_on = opts.fail_on or cfg.fail_on or "error"
    if fail_on not in (*SEVERITIES, "never"):
        raise UsageError(f"--fail-on must be one of {', '.join(SEVERITIES)} or never, not {fail_on!r}")
    if opts.max_growth_pct is not None:
        if not (math.isfinite(opts.max_growth_pct) and opts.max_growth_pct >= 0):
            raise UsageError(f"--max-growth must be a percentage of 0 or more, not {opts.max_growth_pct!r}")
        if opts.baseline is None:
            raise UsageError("--max-growth compares findings with a baseline: give --baseline too")
    try:  # validate rule names and threshold names/values (of unselected rules too) before any work
        for rule in {**{r.id: r for r in settings.rules()},
                     **{i: get_rule(i) for i in thresholds if i != diagnosis.FLOOR}}.values():
            settings.params_for(rule)
        diagnosis.floor_params(thresholds.get(diagnosis.FLOOR))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return settings, fail_on


def read_baseline(path: Path, max_growth_pct: float | None = None) -> Baseline:
    """The findings of an earlier JSON report, by fingerprint (see `Baseline`)."""
    try:
        doc = json.loads(path.read_text())
        return Baseline.from_findings(doc["findings"], max_growth_pct)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{path}: not a traceanalyzer JSON report usable as a baseline ({e})") from None


def run_check(store: Store, opts: CheckOptions, on_file: Callable[[FileResult], None] | None = None,
              on_link: Callable[[link.LinkResult], None] | None = None) -> CheckResult:
    """Check every file under `opts.paths` and the stored runs named there (`check_refs`:
    stored content is not read again, its rules run again), link the timeline and Nsight
    Compute runs given together (unless `opts.link` is False; `link_pairs`), then run the
    cross-run rules on all their runs; then the diagnosis, once per run those passes touched
    (`store_diagnosed`); gather the result."""
    with interrupt.watching():
        return _run_check(store, opts, on_file, on_link)


def _run_check(store: Store, opts: CheckOptions, on_file, on_link) -> CheckResult:
    settings, fail_on = settings_from(opts)
    baseline = read_baseline(opts.baseline, opts.max_growth_pct) if opts.baseline else None
    found = Found()
    done = check_refs(store, opts.paths, settings, on_file=on_file, captures=opts.captures, found=found)
    link_errors: list[InputError] = []
    if opts.link:
        _, link_errors = link_pairs(store, done.files, settings, given_together=True, on_link=on_link, found=found)
    run_ids = done.run_ids
    cross = cross_run_settings(settings)
    if cross is not None and run_ids:
        run_rules(store, run_ids, cross, into=found)
    store_diagnosed(store, found, settings)
    result = load_result(store, run_ids, fail_on)
    result.errors += done.errors + link_errors
    result.not_traces += done.not_traces
    result.baseline = baseline
    return result
