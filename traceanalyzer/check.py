"""`traceanalyzer check`: ingest what is missing, run the rules, gather the result."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .config import ConfigError, find_config, load_config, parse_threshold_option
from .report.model import CheckResult, load_result
from .rules import get_rule
from .rules.base import SEVERITIES
from .rules.engine import Settings, run_rules
from .store import Store


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
    try:  # validate rule names and threshold names/values before doing any work
        for rule in settings.rules():
            settings.params_for(rule)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return settings, fail_on


def read_baseline(path: Path) -> set[str]:
    try:
        doc = json.loads(path.read_text())
        return {f["fingerprint"] for f in doc["findings"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path}: not a traceanalyzer JSON report usable as a baseline ({e})") from None


def run_check(store: Store, opts: CheckOptions, ingest: Callable) -> CheckResult:
    settings, fail_on = settings_from(opts)
    known = read_baseline(opts.baseline) if opts.baseline else None
    results, failed = ingest(store, opts.paths)
    run_ids = list(dict.fromkeys(r.run_id for r in results))
    run_rules(store, run_ids, settings)
    result = load_result(store, run_ids, fail_on)
    if failed:
        result.errors.append(f"{failed} input file(s) could not be read (see the error lines above)")
    if known is not None:
        result.new_fingerprints = {f["fingerprint"] for f in result.findings} - known
    return result
