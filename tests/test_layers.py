"""Imports go one way (file -> reader -> store -> analyses -> rules -> reports -> commands):
the layers contract in pyproject.toml, checked by import-linter, covers every module; inside
the command line, the command modules never import the package that registers them."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .conftest import ROOT

PACKAGE = ROOT / "traceanalyzer"


def _contract() -> dict:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in cfg["contracts"] if c["type"] == "layers" and c["containers"] == ["traceanalyzer"]]
    return contract


def test_every_module_of_the_package_is_in_a_layer():
    layers = {m.strip() for layer in _contract()["layers"] for m in layer.split(":")}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert modules == layers, f"not in a layer: {sorted(modules - layers)}; no such module: {sorted(layers - modules)}"


def test_no_module_imports_from_a_layer_above_it(capsys):
    from importlinter.cli import lint_imports

    code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out


def test_the_architecture_page_places_every_layer_module():
    page = (ROOT / "docs" / "architecture.md").read_text()
    for layer in _contract()["layers"]:
        for m in (x.strip() for x in layer.split(":")):
            assert f"`{m}.py`" in page or f"`{m}/`" in page, f"docs/architecture.md does not place {m}"
