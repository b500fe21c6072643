"""`traceanalyzer check`: ingest what is missing, run the rules, gather the result."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import ConfigError, find_config, load_config, parse_threshold_option
from .ingest import TraceError, find_traces
from .report.model import Baseline, CheckResult, InputError, load_result
from .rules import get_rule
from .rules.base import SEVERITIES
from .rules.engine import Settings, run_rules
from .store import IngestResult, Store


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


@dataclass
class Ingested:
    """What `ingest_paths` did: the runs read or found stored, the inputs that could not be
    read, and the files a folder walk passed over because they are no traces."""

    results: list[IngestResult] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    not_traces: list[tuple[Path, str]] = field(default_factory=list)  # (file, what it is instead)


def ingest_paths(store: Store, paths: list[str], *, skip_existing: bool = False,
                 on_result: Callable[[IngestResult], None] | None = None,
                 on_error: Callable[[InputError], None] | None = None) -> Ingested:
    """Ingest every trace under `paths`, one transaction a file; a file that fails is an
    InputError and the rest go on. `on_result` / `on_error` see each file as it is done."""
    done = Ingested()
    files = list(find_traces(paths, not_traces=done.not_traces))
    if not files:
        none = InputError(" ".join(map(str, paths)), "no trace files here")
        done.errors.append(none)
        if on_error:
            on_error(none)
    for f in files:
        store.let_in_waiting()  # a reader of this store gets in between two files
        try:
            if not f.exists():
                raise TraceError("no such file")
            r = store.ingest(f, skip_existing=skip_existing)
        except Exception as e:  # a reader bug must not stop the batch either
            error = InputError.of(f, e)
        else:
            done.results.append(r)
            if on_result:
                on_result(r)
            continue
        done.errors.append(error)
        if on_error:
            on_error(error)
    return done


def settings_from(opts: CheckOptions) -> tuple[Settings, str]:
    """Merge the config file and the command line (the command line wins)."""
    try:
        cfg = load_config(opts.config) if opts.config else find_config()
        thresholds: dict[str, dict] = {}
        for ref, values in cfg.thresholds.items():
            thresholds.setdefault(get_rule(ref).id, {}).update(values)
        for text in opts.thresholds:
            ref, name, value = parse_threshold_option(text)
            thresholds.setdefault(get_rule(ref).id, {})[name] = value
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
        for rule in {**{r.id: r for r in settings.rules()}, **{i: get_rule(i) for i in thresholds}}.values():
            settings.params_for(rule)
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


def run_check(store: Store, opts: CheckOptions,
              ingest: Callable[[Store, list[str]], Ingested] = ingest_paths) -> CheckResult:
    """Ingest what is not stored yet, run the rules on every run found, gather the result."""
    settings, fail_on = settings_from(opts)
    baseline = read_baseline(opts.baseline, opts.max_growth_pct) if opts.baseline else None
    done = ingest(store, opts.paths)
    run_ids = list(dict.fromkeys(r.run_id for r in done.results))
    run_rules(store, run_ids, settings)
    result = load_result(store, run_ids, fail_on)
    result.errors += done.errors
    result.not_traces += done.not_traces
    result.baseline = baseline
    return result
