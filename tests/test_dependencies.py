"""Every third-party module the code imports is declared in pyproject.toml.

The package may import only its runtime dependencies; tests/ and fixtures/ may also import
the `test` extra. A module missing from pyproject passes here only while some other package
happens to pull it in, and fails on a fresh `pip install '.[test]'`.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .conftest import FIXTURES, ROOT

LOCAL = {"traceanalyzer", "tests", "fixtures", "conftest"} | {p.stem for p in FIXTURES.glob("*.py")}

# Imports the package may make without a runtime dependency: module -> (extra, why). Each is
# imported only inside a function or a try/except ImportError, and its extra must declare it.
OPTIONAL = {
    "distributed": ("dask", "scan --scheduler only; traceanalyzer.distributed says how to install it"),
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(requirements: list[str]) -> set[str]:
    """Distribution names a requirement list installs: each name, and for `name[extra]` what
    the installed `name` lists under that extra (dask[distributed] installs distributed)."""
    names = set()
    for req in requirements:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", req)
        names.add(_norm(m.group(1)))
        for extra in filter(None, (e.strip() for e in (m.group(2) or "").split(","))):
            try:
                subs = importlib.metadata.requires(m.group(1)) or []
            except importlib.metadata.PackageNotFoundError:
                continue
            names |= {_norm(re.match(r"[A-Za-z0-9._-]+", s).group()) for s in subs
                      if re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", s)}
    return names


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lazy_or_guarded(tree: ast.Module) -> set[ast.AST]:
    """Import nodes inside a function body or a try whose handlers catch ImportError."""
    found: set[ast.AST] = set()

    def catches_import_error(node: ast.Try) -> bool:
        names = {n.id for h in node.handlers for n in ast.walk(h.type or ast.Name("BaseException"))
                 if isinstance(n, ast.Name)}
        return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found |= set(ast.walk(node))
        elif isinstance(node, ast.Try) and catches_import_error(node):
            for stmt in node.body:
                found |= set(ast.walk(stmt))
    return found


def imports(folder: str) -> dict[str, list[tuple[str, bool]]]:
    """Top-level module name -> [(file:line, lazy or guarded)] for every absolute import
    under `folder`, counting `pytest.importorskip("x")` and `import_module("x")` too."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        soft = _lazy_or_guarded(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                  and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("importorskip", "import_module")
                  and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                  and not node.args[0].value.startswith(".")):
                names = [node.args[0].value]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    out.setdefault(top, []).append((where, node in soft))
    return out


def undeclared(found: dict[str, list], declared: set[str]) -> list[str]:
    """`module (file:line)` for each module whose distribution is not declared. A module that
    is not installed is taken to come from the distribution of the same name."""
    dists = importlib.metadata.packages_distributions()
    return [f"{mod} ({places[0][0]})" for mod, places in sorted(found.items())
            if not {_norm(d) for d in dists.get(mod, [mod])} & declared]


def test_package_imports_only_runtime_dependencies():
    project = _project()
    found = imports("traceanalyzer")
    for mod, (extra, _why) in OPTIONAL.items():
        places = found.pop(mod, [])
        assert places, f"OPTIONAL lists {mod}, which traceanalyzer/ does not import: drop it"
        hard = [where for where, soft in places if not soft]
        assert not hard, f"{mod} is optional but imported at module level, unguarded: {hard}"
        assert undeclared({mod: places}, _declared(project["optional-dependencies"][extra])) == [], \
            f"{mod} is not declared in the [{extra}] extra"
    missing = undeclared(found, _declared(project["dependencies"]))
    assert not missing, f"imported by traceanalyzer/ but not in pyproject's dependencies: {missing}"


def test_tests_and_fixtures_import_only_declared_dependencies():
    project = _project()
    declared = _declared(project["dependencies"] + project["optional-dependencies"]["test"])
    for folder in ("tests", "fixtures"):
        missing = undeclared(imports(folder), declared)
        assert not missing, f"imported by {folder}/ but not in pyproject's dependencies or [test] extra: {missing}"


def test_the_walk_sees_imports_and_names_what_is_missing():
    """The checks above can fail: the walk finds real imports, and an empty list declares nothing."""
    found = imports("traceanalyzer")
    assert {"duckdb", "pyarrow", "numpy", "distributed"} <= found.keys()
    assert not LOCAL & found.keys() and not sys.stdlib_module_names & found.keys()
    assert [m.split(" ")[0] for m in undeclared({"duckdb": found["duckdb"]}, set())] == ["duckdb"]
    assert "pytest" in imports("tests") and "jsonschema" in imports("tests")  # importorskip counts
