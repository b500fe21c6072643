"""Settings from `[tool.traceanalyzer]` in pyproject.toml or from traceanalyzer.toml.

Looked up from the current folder upwards; the first file that has settings wins.
Command-line options override file settings. Example::

    [tool.traceanalyzer]
    select = ["T001", "T002"]
    ignore = []
    fail-on = "warning"
    [tool.traceanalyzer.thresholds.T001]
    min_gap_ns = 10000
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(Exception):
    pass


@dataclass
class FileConfig:
    path: Path | None = None
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    fail_on: str | None = None
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)


_KEYS = {"select", "ignore", "fail-on", "thresholds"}


def find_config(start: Path | None = None) -> FileConfig:
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        own = folder / "traceanalyzer.toml"
        if own.is_file():
            return _parse(own, _load(own))
        py = folder / "pyproject.toml"
        if py.is_file():
            section = _load(py).get("tool", {}).get("traceanalyzer")
            if section is not None:
                return _parse(py, section)
    return FileConfig()


def load_config(path: Path) -> FileConfig:
    data = _load(path)
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("traceanalyzer", {})
    return _parse(path, data)


def _load(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None


def _parse(path: Path, data: dict) -> FileConfig:
    unknown = set(data) - _KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown settings {sorted(unknown)} (known: {sorted(_KEYS)})")
    thresholds = data.get("thresholds", {})
    if not isinstance(thresholds, dict) or not all(isinstance(v, dict) for v in thresholds.values()):
        raise ConfigError(f"{path}: [thresholds] must hold one table per rule id")
    return FileConfig(path, list(data.get("select", [])), list(data.get("ignore", [])),
                      data.get("fail-on"), {k.upper(): dict(v) for k, v in thresholds.items()})


def parse_threshold_option(text: str) -> tuple[str, str, str]:
    """'T001.min_gap_ns=10000' -> ('T001', 'min_gap_ns', '10000')."""
    try:
        key, value = text.split("=", 1)
        rule, name = key.split(".", 1)
    except ValueError:
        raise ConfigError(f"--threshold takes RULE.NAME=VALUE, got {text!r}") from None
    return rule.strip().upper(), name.strip(), value.strip()
