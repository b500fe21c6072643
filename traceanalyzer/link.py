"""An Nsight Compute run joined to the timeline (nsys or Kineto) of the same program.

A timeline says which kernels matter end to end; Nsight Compute says why a kernel is slow, for
the launches it profiled. Linking matches each ncu launch to the timeline's kernels, so that the
ncu-based rules can speak of the timeline's kernels (`rules/_ncu.py`) and a report can show both
for one kernel. The links are stored (`kernel_links`, written by `Store.write_links`).

A launch is matched in two steps, and only where the answer is sure:

1. **The kernel, by name.** ncu, nsys and Kineto spell one kernel differently: nsys keeps the
   mangled name and NVIDIA's demangling (`void k<(int)128>(const T1 *, int)`), ncu prints
   NVIDIA's demangling of its version (`void k<128>(const float *, int)`) or only the function
   (`--print-kernel-base function`), Kineto the C++ ABI's (`void k<128>(float const*, int)`,
   `{lambda(float)#1}` for NVIDIA's `[lambda(float) (instance 1)]`, `2ul` for `(unsigned long)2`).
   Tried in order: the same mangled name (`mangled`); the same name normalised (`name`: spacing,
   `const`, casts and suffixes of template numbers, lambda and anonymous-namespace spellings,
   then the parameters left out, since NVIDIA writes them as template parameters); the same
   function name, when exactly one timeline kernel has it (`function`). A name that matches
   several timeline kernels at the first step that finds any is left unmatched.
2. **The launch, among the kernel's.** With ncu's grid and block: the timeline configuration
   with the same grid and block (`grid and block`), the n-th ncu launch of it matched to the n-th
   timeline launch of it (both in launch order; ncu may have profiled fewer). Without them (old
   ncu exports): the kernel's only configuration, or, when it ran in several, the n-th ncu launch
   of the kernel matched to its n-th timeline launch (`launch order`).

Every ncu launch gets a row (`side` `both` or `ncu`, with the reason it is unmatched), and so
does every timeline configuration that no ncu launch matched (`side` `timeline`). Devices are
not compared: ncu numbers the devices it sees, which need not be the timeline's numbering.

Which files are linked: those given together to `check` (one timeline and one ncu run), those
side by side in a folder (`pairs`: the same stem, or the folder's only pair), or any two runs by
`traceanalyzer link`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import pyarrow as pa

from . import schema
from .ingest.kineto_names import kernel_short_name
from .store import Store

# What a run is to a link, from what it holds, whichever file it came from: an Nsight Compute
# run has metrics of its launches; a timeline has kernels with timestamps (a CPU-only profile
# has nothing to match).
_ROLES_SQL = """
SELECT run_id, CASE WHEN run_id IN (SELECT run_id FROM kernel_metrics WHERE list_contains($ids, run_id)) THEN 'ncu'
                    WHEN run_id IN (SELECT run_id FROM kernels WHERE list_contains($ids, run_id)
                                    AND start_ns IS NOT NULL) THEN 'timeline'
                    ELSE 'neither' END
FROM runs WHERE list_contains($ids, run_id)"""

# -- names --------------------------------------------------------------------------------

# NVIDIA's demangler writes template numbers with a cast (`(int)128`, `(unsigned long)2`,
# `(bool)1`), the C++ ABI's with a suffix (`2ul`) or as a word (`true`).
_BOOL = re.compile(r"\(bool\)\s*([01])\b")
_CAST = re.compile(r"\((?:(?:un)?signed\s+)?(?:int|long\s+long|long|short|char|__int128)\)\s*(?=-?\d)")
_SUFFIX = re.compile(r"(?<![\w.])(-?\d+)(?:ull|llu|ul|lu|ll|u|l)\b", re.IGNORECASE)
_LAMBDA_NV = re.compile(r"\[lambda\((.*?)\)\s*\(instance\s+(\d+)\)\]")
_ANONYMOUS = re.compile(r"\(anonymous namespace\)|<unnamed>")
_QUALIFIER = re.compile(r"\b(?:const|volatile|struct|class|enum)\b")
_OPERATOR_CALL = re.compile(r"operator\s*\(\)")
_CLOSERS = {")": "(", ">": "<", "]": "[", "}": "{"}


def _without_params(name: str) -> str:
    """`name` without its trailing parameter list (a balanced `(...)`)."""
    s = name.rstrip()
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        c = s[i]
        if c in _CLOSERS:
            depth += 1
        elif c in _CLOSERS.values():
            depth -= 1
            if depth == 0:
                return s[:i] if i > 0 else s
    return s


def _canonical(text: str) -> str:
    s = text.strip()
    if s.startswith("void "):  # every kernel returns void; NVIDIA writes it for templates only
        s = s[5:]
    s = _BOOL.sub(lambda m: "true" if m.group(1) == "1" else "false", s)
    s = _CAST.sub("", s)
    s = _SUFFIX.sub(r"\1", s)
    s = _LAMBDA_NV.sub(r"{lambda(\1)#\2}", s)
    s = _ANONYMOUS.sub("(anonymous namespace)", s)
    s = _OPERATOR_CALL.sub("operator()", s)
    s = _QUALIFIER.sub("", s)
    return "".join(s.split())


def name_keys(name: str | None) -> tuple[str | None, str | None]:
    """The normalised name with its parameters and without them (None for no name, or a mangled
    one). Two spellings of one kernel by ncu, nsys and Kineto give the same keys."""
    if not name or name.startswith("_Z"):
        return None, None
    return _canonical(name), _canonical(_without_params(name))


def function_name(name: str | None, mangled: str | None = None) -> str | None:
    """The kernel's function name, from its demangled name, or else from its mangled one."""
    if name and not name.startswith("_Z"):
        return kernel_short_name(name)
    text = mangled or name
    return _mangled_function(text) if text else None


_SOURCE_NAME = re.compile(r"(\d+)")


def _mangled_function(mangled: str) -> str | None:
    """The function's own name in an Itanium mangled name: `_Z15bias_act_kernelPfPKfi` ->
    `bias_act_kernel`, `_ZN2at6native29vectorized_elementwise_kernelI...` -> the last nested
    name before the template arguments (an anonymous namespace's `_GLOBAL__N_...` skipped)."""
    if not mangled.startswith("_Z"):
        return None
    nested = mangled.startswith("_ZN")
    i, names = (3 if nested else 2), []
    while i < len(mangled):
        m = _SOURCE_NAME.match(mangled, i)
        if m is not None:
            n = int(m.group(1))
            names.append(mangled[m.end():m.end() + n])
            i = m.end() + n
            if not nested:
                break
        elif nested and mangled[i] in "KVr":  # cv-qualifiers of a member function
            i += 1
        elif nested and mangled.startswith("St", i):  # std::
            i += 2
        elif nested and mangled[i] == "S":  # a substitution, S_ or S<n>_
            close = mangled.find("_", i)
            if close < 0:
                break
            i = close + 1
        else:  # template arguments (I), the end of the name (E), or something not parsed here
            break
    names = [n for n in names if n and not n.startswith("_GLOBAL__N")]
    return names[-1] if names else None


# -- matching -----------------------------------------------------------------------------

def _dims(r: dict, which: str) -> tuple | None:
    """(x, y, z) of a row's grid or block, missing y and z as 1; None without x."""
    x = r.get(f"{which}_x")
    if x is None:
        return None
    return (int(x), int(r.get(f"{which}_y") or 1), int(r.get(f"{which}_z") or 1))


@dataclass
class _Kernel:
    """A timeline kernel (one name) with its configurations and launches in launch order."""

    name: str
    mangled: str | None
    configs: dict = field(default_factory=dict)  # (grid, block) -> {"device_id", "launches", "first_id"}
    by_config: dict = field(default_factory=dict)  # (grid, block) -> [(kernel_id, device_id)] in order
    in_order: list = field(default_factory=list)  # [(kernel_id, device_id, grid, block)] in order
    keys: tuple = (None, None)  # name_keys(name)
    function: str | None = None  # function_name(name, mangled)

    def __post_init__(self):
        self.keys = name_keys(self.name)
        self.function = function_name(self.name, self.mangled)


def _kernels(configs: list[dict], launches: list[dict]) -> dict[str, _Kernel]:
    out: dict[str, _Kernel] = {}
    for c in configs:
        k = out.setdefault(c["name"], _Kernel(c["name"], c.get("mangled_name")))
        key = (_dims(c, "grid"), _dims(c, "block"))
        have = k.configs.get(key)
        if have is None:
            k.configs[key] = {"device_id": c.get("device_id"), "launches": int(c["launches"]),
                              "first_id": c["first_id"], "first_start_ns": c.get("first_start_ns")}
        else:  # the same configuration on another device
            have["launches"] += int(c["launches"])
            if c.get("first_start_ns") is not None and (have["first_start_ns"] is None
                                                        or c["first_start_ns"] < have["first_start_ns"]):
                have.update(first_id=c["first_id"], first_start_ns=c["first_start_ns"], device_id=c.get("device_id"))
    for r in launches:  # already in launch order
        k = out.get(r["name"])
        if k is None:
            continue
        grid, block = _dims(r, "grid"), _dims(r, "block")
        k.in_order.append((r["kernel_id"], r.get("device_id"), grid, block))
        k.by_config.setdefault((grid, block), []).append((r["kernel_id"], r.get("device_id")))
    return out


def _resolve(ncu_name: str, kernels: dict[str, _Kernel]) -> tuple[str | None, str | None, str | None]:
    """(timeline name, how the names matched, why unmatched) for one ncu kernel name."""
    if ncu_name.startswith("_Z"):
        found = sorted(k.name for k in kernels.values() if ncu_name in (k.mangled, k.name))
        if found:
            return (found[0], "mangled", None) if len(found) == 1 else (None, None, _several(found))
    full, bare = name_keys(ncu_name)
    if full is not None:
        for level in (0, 1):
            found = sorted(k.name for k in kernels.values() if k.keys[level] == (full, bare)[level])
            if len(found) == 1:
                return found[0], "name", None
            if found:
                return None, None, _several(found)
    fn = function_name(ncu_name)
    found = sorted(k.name for k in kernels.values() if fn and k.function == fn)
    if len(found) == 1:
        return found[0], "function", None
    if found:
        return None, None, f"its function name {fn!r} is that of {len(found)} timeline kernels"
    return None, None, "no timeline kernel of this name"


def _several(names: list[str]) -> str:
    return f"the name matches {len(names)} timeline kernels"


def _dims_text(d: tuple | None) -> str:
    return "?" if d is None else f"({d[0]}, {d[1]}, {d[2]})"


def match(configs: list[dict], launches: list[dict], ncu: list[dict]) -> list[dict]:
    """The `kernel_links` rows (without the run ids) for the ncu launches `ncu` (`kernel_id`,
    `name`, grid and block columns, in ncu's order) against a timeline given as its launch
    configurations (`configs`: `device_id`, `name`, `mangled_name`, grid and block columns,
    `launches`, `first_id`, `first_start_ns`) and its launches in launch order (`launches`:
    `kernel_id`, `device_id`, `name`, grid and block columns; at least the first as many of each
    kernel as ncu has launches). See the module's docstring."""
    kernels = _kernels(configs, launches)
    resolved: dict[str, tuple] = {}
    taken: dict[tuple, int] = {}  # (timeline name, grid, block) or (name,) -> launches matched so far
    used: set[tuple] = set()  # (name, grid, block) matched by some ncu launch
    rows = []
    for n in sorted(ncu, key=lambda r: r["kernel_id"]):
        ncu_name = n.get("name") or ""
        if ncu_name not in resolved:
            resolved[ncu_name] = _resolve(ncu_name, kernels) if ncu_name else (None, None, "no kernel name")
        tname, name_match, why = resolved[ncu_name]
        grid, block = _dims(n, "grid"), _dims(n, "block")
        row = {"ncu_kernel_id": int(n["kernel_id"]), "ncu_name": n.get("name"), "side": "ncu",
               "name_match": None, "launch_match": None, "unmatched": why}
        row.update(_dims_row(grid, block))
        if tname is not None:
            row.update(_launch(kernels[tname], grid, block, taken, used))
            if row["side"] == "both":
                row["name_match"] = name_match
        rows.append(row)
    for k in kernels.values():
        for (grid, block), c in k.configs.items():
            if (k.name, grid, block) not in used:
                rows.append({"side": "timeline", "ncu_kernel_id": None, "ncu_name": None, "kernel_id": c["first_id"],
                             "device_id": c["device_id"], "name": k.name, **_dims_row(grid, block),
                             "name_match": None, "launch_match": None,
                             "unmatched": f"not profiled by ncu ({c['launches']} launch(es) in the timeline)"})
    return rows


def _dims_row(grid: tuple | None, block: tuple | None) -> dict:
    g, b = grid or (None, None, None), block or (None, None, None)
    return {"grid_x": g[0], "grid_y": g[1], "grid_z": g[2], "block_x": b[0], "block_y": b[1], "block_z": b[2]}


def _launch(k: _Kernel, grid: tuple | None, block: tuple | None, taken: dict, used: set) -> dict:
    """The timeline launch (and configuration) an ncu launch of kernel `k` is, or why none is."""
    if grid is not None and block is not None:
        if (grid, block) not in k.configs:
            shapes = ", ".join(f"grid {_dims_text(g)} block {_dims_text(b)}" for g, b in sorted(
                k.configs, key=lambda c: (c[0] or (), c[1] or ())))
            return {"unmatched": f"the timeline runs this kernel with {shapes}, not grid {_dims_text(grid)} "
                                 f"block {_dims_text(block)}"}
        key, how = (k.name, grid, block), "grid and block"
        order = k.by_config.get((grid, block), [])
        config = k.configs[(grid, block)]
    elif len(k.configs) == 1:
        ((grid, block),) = k.configs
        key, how = (k.name, grid, block), "only configuration"
        order = k.by_config.get((grid, block), [])
        config = k.configs[(grid, block)]
    else:
        key, how = (k.name,), "launch order"
        n = taken.get(key, 0)
        if n >= len(k.in_order):
            return {"unmatched": f"ncu has no grid and block, the kernel runs in {len(k.configs)} configurations, "
                                 f"and the timeline has only {len(k.in_order)} launch(es) of it to match in order"}
        kernel_id, device_id, grid, block = k.in_order[n]
        taken[key] = n + 1
        used.add((k.name, grid, block))
        return {"side": "both", "kernel_id": kernel_id, "device_id": device_id, "name": k.name,
                **_dims_row(grid, block), "launch_match": how, "unmatched": None}
    n = taken.get(key, 0)
    taken[key] = n + 1
    used.add((k.name, grid, block))
    kernel_id, device_id = order[n] if n < len(order) else (None, config["device_id"])
    return {"side": "both", "kernel_id": kernel_id, "device_id": device_id, "name": k.name,
            **_dims_row(grid, block), "launch_match": how, "unmatched": None}


# -- linking two stored runs ----------------------------------------------------------------

_DIMS = "grid_x, grid_y, grid_z, block_x, block_y, block_z"
CONFIGS_SQL = f"""
SELECT device_id, name, any_value(mangled_name) AS mangled_name, {_DIMS}, count(*) AS launches,
       arg_min(kernel_id, (start_ns, kernel_id)) AS first_id, min(start_ns) AS first_start_ns
FROM kernels WHERE run_id = $run_id AND name IS NOT NULL
GROUP BY device_id, name, {_DIMS}
ORDER BY name, first_start_ns NULLS LAST
"""
# The first $n launches of each kernel and of each of its configurations, in launch order: all
# that matching can use when ncu profiled $n launches.
LAUNCHES_SQL = f"""
SELECT kernel_id, device_id, name, {_DIMS} FROM kernels WHERE run_id = $run_id AND name IS NOT NULL
QUALIFY row_number() OVER (PARTITION BY name ORDER BY start_ns, kernel_id) <= $n
     OR row_number() OVER (PARTITION BY name, {_DIMS} ORDER BY start_ns, kernel_id) <= $n
ORDER BY start_ns, kernel_id
"""
NCU_SQL = f"SELECT kernel_id, name, {_DIMS} FROM kernels WHERE run_id = $run_id ORDER BY kernel_id"


class LinkError(Exception):
    """Two runs that cannot be linked (not a timeline and an ncu run)."""


@dataclass
class LinkResult:
    """What linking a timeline run and an ncu run found (the rows written to `kernel_links`)."""

    run_id: str  # the timeline run
    ncu_run_id: str
    rows: list[dict]
    changed: bool = True  # the links differ from those stored before

    @property
    def matched(self) -> list[dict]:
        return [r for r in self.rows if r["side"] == "both"]

    @property
    def ncu_unmatched(self) -> list[dict]:
        return [r for r in self.rows if r["side"] == "ncu"]

    @property
    def timeline_unmatched(self) -> list[dict]:
        return [r for r in self.rows if r["side"] == "timeline"]

    def summary(self) -> str:
        """One line: how many ncu launches matched, and what is unmatched on either side."""
        n_ncu = len(self.matched) + len(self.ncu_unmatched)
        return (f"{len(self.matched)} of {n_ncu} ncu launch(es) matched to timeline kernels; "
                f"{len(self.ncu_unmatched)} ncu launch(es) and {len(self.timeline_unmatched)} timeline "
                f"configuration(s) unmatched")


def run_roles(store: Store, run_ids: list[str]) -> dict[str, str]:
    """Per stored run of `run_ids`: `timeline`, `ncu` or `neither` (a run no link can use). The one
    answer to "is this an Nsight Compute run?" that reports and diffs ask too."""
    return dict(store.sql(_ROLES_SQL, {"ids": list(run_ids)}).fetchall())


def link_runs(store: Store, run_id: str, ncu_run_id: str) -> LinkResult:
    """Match the launches of the ncu run `ncu_run_id` to the kernels of the timeline run `run_id`
    and store the links (replacing those of the pair). LinkError when the runs are not a
    timeline and an ncu run."""
    known = run_roles(store, [run_id, ncu_run_id])
    roles = (known.get(run_id), known.get(ncu_run_id))
    if roles != ("timeline", "ncu"):
        words = {"timeline": "a timeline", "ncu": "an Nsight Compute run", "neither": "neither", None: "not stored"}
        raise LinkError(f"a link joins a timeline run (kernels with timestamps) to an Nsight Compute run (metrics "
                        f"per launch); {run_id} is {words[roles[0]]} and {ncu_run_id} is {words[roles[1]]}")
    ncu = store.arrow(NCU_SQL, {"run_id": ncu_run_id}).to_pylist()
    configs = store.arrow(CONFIGS_SQL, {"run_id": run_id}).to_pylist()
    launches = store.arrow(LAUNCHES_SQL, {"run_id": run_id, "n": max(1, len(ncu))}).to_pylist()
    rows = match(configs, launches, ncu)
    before = stored_links(store, run_id, ncu_run_id)
    columns = [c for c in schema.KERNEL_LINKS.column_names if c not in ("run_id", "ncu_run_id")]
    changed = _comparable(before, columns) != _comparable(rows, columns)
    if changed:
        table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows],
                                     schema=schema.arrow_schema("kernel_links", columns))
        store.write_links(run_id, ncu_run_id, table)
    return LinkResult(run_id, ncu_run_id, rows, changed)


def _comparable(rows: list[dict], columns: list[str]) -> list[tuple]:
    return sorted((tuple("" if r.get(c) is None else str(r.get(c)) for c in columns) for r in rows))


def stored_links(store: Store, run_id: str, ncu_run_id: str | None = None) -> list[dict]:
    """The stored `kernel_links` rows of the timeline run `run_id` (with one ncu run, or all), to
    ncu runs still stored."""
    return store.arrow(
        """SELECT l.* FROM kernel_links l JOIN runs r ON r.run_id = l.ncu_run_id
           WHERE l.run_id = $run_id AND ($ncu IS NULL OR l.ncu_run_id = $ncu)
           ORDER BY l.ncu_run_id, l.side, l.ncu_kernel_id NULLS LAST, l.name, l.kernel_id""",
        {"run_id": run_id, "ncu": ncu_run_id}).to_pylist()


def linked_ncu_runs(store: Store, run_id: str) -> list[str]:
    """The ncu runs (still stored) linked to the timeline run `run_id`, in id order."""
    return [r[0] for r in store.sql(
        """SELECT DISTINCT l.ncu_run_id FROM kernel_links l JOIN runs r ON r.run_id = l.ncu_run_id
           WHERE l.run_id = ? ORDER BY 1""", [run_id]).fetchall()]


# -- which runs go together ------------------------------------------------------------------

def stem(path: str | Path) -> str:
    """A file's name up to its first dot: `step.nsys.sqlite` and `step.ncu.csv` share `step`."""
    return Path(path).name.split(".", 1)[0]


def pairs(runs: Iterable[tuple[str, str, str]], *, given_together: bool = False) -> list[tuple[str, str]]:
    """The (timeline run, ncu run) pairs to link among `runs` (path, run id, `run_role`): in each
    folder, every timeline with every ncu run of the same stem, then the folder's only timeline
    with its only ncu run when both are left unpaired; with `given_together` (files named on one
    command line), also the only timeline with the only ncu run of them all."""
    runs = list(dict.fromkeys(runs))
    timelines = [r for r in runs if r[2] == "timeline"]
    ncus = [r for r in runs if r[2] == "ncu"]
    if given_together and len(timelines) == 1 and len(ncus) == 1:
        return [(timelines[0][1], ncus[0][1])]
    out: list[tuple[str, str]] = []
    folders = dict.fromkeys(str(Path(p).resolve().parent) for p, _, _ in timelines + ncus)
    for folder in folders:
        here_t = [r for r in timelines if str(Path(r[0]).resolve().parent) == folder]
        here_n = [r for r in ncus if str(Path(r[0]).resolve().parent) == folder]
        paired: set[str] = set()
        for t in here_t:
            for n in here_n:
                if stem(t[0]) == stem(n[0]):
                    out.append((t[1], n[1]))
                    paired.update((t[1], n[1]))
        left_t = [t for t in here_t if t[1] not in paired]
        left_n = [n for n in here_n if n[1] not in paired]
        if len(left_t) == 1 and len(left_n) == 1 and len(here_t) == 1 and len(here_n) == 1:
            out.append((left_t[0][1], left_n[0][1]))
    return list(dict.fromkeys(out))


# -- words for a command line ------------------------------------------------------------------

def describe(result: LinkResult, names: dict[str, str] | None = None, limit: int | None = 20) -> list[str]:
    """Lines for a person: the summary, then each unmatched launch and configuration (up to
    `limit` of each; None: all)."""
    names = names or {}
    out = [f"linked {names.get(result.run_id, result.run_id)} <- {names.get(result.ncu_run_id, result.ncu_run_id)}: "
           f"{result.summary()}"]
    for title, rows in (("ncu launch", result.ncu_unmatched), ("timeline kernel", result.timeline_unmatched)):
        for r in rows if limit is None else rows[:limit]:
            what = f"ID {r['ncu_kernel_id']} {r['ncu_name']}" if title == "ncu launch" else r["name"]
            out.append(f"  unmatched {title}: {what}: {r['unmatched']}")
        if limit is not None and len(rows) > limit:
            out.append(f"  ... {len(rows) - limit} more unmatched {title}(s)")
    return out

