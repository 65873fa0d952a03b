"""The package's structure as drawn from its imports: layers in order, no circles, a low tower.

The graph is read from the source (``ast``), not by importing: every ``import`` statement of a
``deepgemm_ref`` module counts, at module level or inside a function (a late import is still a
dependency), and so do those under ``if TYPE_CHECKING:`` (a type-only import still ties two
files together).  Importing ``a.b.c`` from outside ``a.b`` also runs ``a.b``'s ``__init__``, so
that package counts as a dependency too.

Two granularities:

* files: every module is a node;
* rooms: each top-level module of ``deepgemm_ref`` and each sub-package (with everything inside
  it) is one room, the package's ``__init__`` is the room ``__init__``; an arrow for every import
  of one room by another.  Floors are the longest chain of arrows once circles are merged.

:data:`LAYERS` is the architecture as data: every room belongs to one layer, and a room imports
only rooms of its own layer or of layers below (and, in the families layer, no peer at all).
Every check below is a function of a graph, and each test shows its check failing on a graph
with a deliberately bad import parsed from source written in the test itself.

Run ``python tests/test_imports.py`` to print the floors room by room and file by file.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "deepgemm_ref"

#: The layers, bottom to top: each room's layer.  A room imports rooms of its own layer or below.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    # errors, exact arithmetic, trace, dry-run flag, the parallel pool, interop, settings storage,
    # groups of ranks and their transports
    ("base", frozenset({"_exports", "_memory", "_parallel", "_state", "_version", "comm", "dryrun", "dtypes", "errors",
                        "exact", "interop", "trace"})),
    # formats, certified rounding, the one core, numerics options, arch profiles, epilogue objects
    ("numerics", frozenset({"certified", "config", "core", "epilogue", "formats", "profiles", "settings"})),
    # the dispatcher, runtime settings, argument / operand / output / scale checks, the executor
    ("toolkit", frozenset({"api", "executor", "namespace", "runtime", "toolkit"})),
    # kernel families and their peers: none imports another
    ("families", frozenset({"attention", "einsum", "ep", "gemm", "grouped", "layout", "locality_domain", "mega",
                            "quant"})),
    # the package face: DeepGEMM's namespaces and testing helpers
    ("face", frozenset({"__init__", "_C", "names", "testing", "utils"})),
    # the golden workflow: drives the module it is handed
    ("golden", frozenset({"golden"})),
    # tools on top of everything
    ("tools", frozenset({"cli", "pytest_plugin", "strategies"})),
)
#: Layers whose rooms are peers: no room of the layer imports another room of it.
PEER_LAYERS = frozenset({"families"})
#: Arrows that the layer order would allow but the architecture forbids: the golden workflow
#: imports ``testing.numeric`` and ``_version``, never the face that assembles the namespace.
FORBIDDEN = frozenset({("golden", "__init__"), ("golden", "_C"), ("golden", "utils")})
#: The kernel families (no private name of one is imported by another room).
FAMILIES = ("gemm", "grouped", "einsum", "attention", "mega")
#: The ceiling of the room-level tower.
MAX_FLOORS = 9

Graph = dict[str, set[str]]


# ----------------------------------------------------------------------------------------------
# reading the graph
# ----------------------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _read_sources() -> tuple[tuple[str, str, bool], ...]:
    return tuple((_module_name(p), p.read_text(), p.name == "__init__.py") for p in sorted(PKG.rglob("*.py")))


def sources() -> dict[str, tuple[str, bool]]:
    """Every module of the package: dotted name -> (source, is a package ``__init__``)."""
    return {m: (src, is_pkg) for m, src, is_pkg in _read_sources()}


@functools.cache
def _import_targets(mod: str, src: str, is_pkg: bool, known: frozenset[str]) -> tuple[tuple[str, str | None], ...]:
    """(module or package imported, the name taken from it or None) of every import in ``src``."""
    out: list[tuple[str, str | None]] = []
    for node in _imports(ast.parse(src)):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] == "deepgemm_ref"]
            continue
        base = _resolve(mod, is_pkg, node)
        if base.split(".")[0] != "deepgemm_ref":
            continue
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            out.append((sub, None) if sub in known else (base, alias.name))
    return tuple(out)


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _with_parents(target: str, importer: str, known: Mapping[str, object]) -> set[str]:
    """``target`` and the packages whose ``__init__`` importing it runs (those not above ``importer``)."""
    out = {target}
    parts = target.split(".")
    for i in range(2, len(parts)):
        parent = ".".join(parts[:i])
        if parent in known and not (importer == parent or importer.startswith(parent + ".")):
            out.add(parent)
    return out


def graph(extra: Mapping[str, str] | None = None) -> tuple[Graph, list[tuple[str, str, str]]]:
    """(file graph: module -> the package modules it imports, [(importer, module, private name)]).

    ``extra``: module name -> source added to that module's own (a deliberately bad import)."""
    srcs = sources()
    for mod, text in (extra or {}).items():
        src, is_pkg = srcs.get(mod, ("", False))
        srcs[mod] = (src + "\n" + text, is_pkg)
    edges: Graph = {m: set() for m in srcs}
    private: list[tuple[str, str, str]] = []
    known = frozenset(srcs)
    for mod, (src, is_pkg) in srcs.items():
        for target, name in _import_targets(mod, src, is_pkg, known):
            while target not in srcs and "." in target:
                target = target.rsplit(".", 1)[0]
            if target == mod:
                continue
            edges[mod] |= _with_parents(target, mod, srcs) - {mod}
            if name is not None and name.startswith("_") and not name.startswith("__"):
                private.append((mod, target, name))
    return edges, private


def room(mod: str) -> str:
    """The room of a module: ``__init__`` for the package's face, else its first name below it."""
    parts = mod.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def rooms(edges: Graph) -> Graph:
    """The room graph: an arrow for every import of one room by another."""
    out: Graph = {room(m): set() for m in edges}
    for v, ws in edges.items():
        out[room(v)] |= {room(w) for w in ws} - {room(v)}
    return out


# ----------------------------------------------------------------------------------------------
# the checks (each returns what is wrong, empty when nothing is)
# ----------------------------------------------------------------------------------------------

def circles(edges: Graph) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def floors(edges: Graph) -> dict[str, int]:
    """Floor of every node, circles merged: 1 without imports, else one above its highest import."""
    comp_of: dict[str, int] = {}
    comps = circles(edges)
    for i, comp in enumerate(comps):
        for v in comp:
            comp_of[v] = i
    key = {v: comp_of.get(v, -1 - n) for n, v in enumerate(sorted(edges))}
    members: dict[int, list[str]] = {}
    for v, k in key.items():
        members.setdefault(k, []).append(v)
    memo: dict[int, int] = {}

    def floor(k: int) -> int:
        if k not in memo:
            deps = {key[w] for v in members[k] for w in edges[v] if w in key} - {k}
            memo[k] = 1 + max((floor(d) for d in deps), default=0)
        return memo[k]

    return {v: floor(key[v]) for v in edges}


def layer_of(room_name: str) -> int | None:
    return next((i for i, (_, members) in enumerate(LAYERS) if room_name in members), None)


def unplaced_rooms(room_edges: Graph) -> list[str]:
    """Rooms that belong to no layer."""
    return sorted(r for r in room_edges if layer_of(r) is None)


def layer_violations(room_edges: Graph) -> list[tuple[str, str]]:
    """Arrows into a higher layer, between peers of a peer layer, or forbidden outright."""
    bad = []
    for v, ws in room_edges.items():
        lv = layer_of(v)
        for w in ws:
            lw = layer_of(w)
            if lv is None or lw is None:
                continue
            peers = lv == lw and LAYERS[lv][0] in PEER_LAYERS
            if lw > lv or peers or (v, w) in FORBIDDEN:
                bad.append((v, w))
    return sorted(bad)


def private_cross_room_imports(edges: Graph, private: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """``_name`` imports from outside the package (family, toolkit, layout, ...) that defines it;
    top-level modules are rooms of their own."""
    srcs = sources()

    def package(mod: str) -> str:
        return mod if srcs.get(mod, ("", False))[1] else mod.rsplit(".", 1)[0]

    return [(m, t, n) for m, t, n in private
            if package(t) == "deepgemm_ref" or not (m == package(t) or m.startswith(package(t) + "."))]


# ----------------------------------------------------------------------------------------------
# tests: the real graph passes; each check fails on a deliberate bad import
# ----------------------------------------------------------------------------------------------

#: Deliberately bad imports, as they would be written in the module named (never written to disk).
BAD_CIRCLE = {"deepgemm_ref.formats": "from .certified import round_certified"}  # certified imports formats
BAD_UPWARD = {"deepgemm_ref.core": "def f():\n    from .golden import check"}  # a late import counts
BAD_TYPE_ONLY = {"deepgemm_ref.exact": "if TYPE_CHECKING:\n    from .formats import Format"}  # formats -> exact
BAD_PEER = {"deepgemm_ref.gemm": "from .grouped import m_grouped_fp8_gemm_nt_contiguous"}
BAD_FACE = {"deepgemm_ref.golden.call": "import deepgemm_ref"}
BAD_PRIVATE = {"deepgemm_ref.attention.logits": "from ..gemm import _make_fp8_fp4_variant"}
#: A chain of late imports that stacks five more rooms on top of the tower.
BAD_TOWER = {"deepgemm_ref.exact": "def f():\n    from . import trace",
             "deepgemm_ref.trace": "def f():\n    from . import _version",
             "deepgemm_ref._version": "def f():\n    from . import dtypes",
             "deepgemm_ref.dtypes": "def f():\n    from . import _state",
             "deepgemm_ref._state": "def f():\n    from . import _parallel"}


def test_every_room_has_a_layer():
    assert unplaced_rooms(rooms(graph()[0])) == []
    assert unplaced_rooms(rooms(graph({"deepgemm_ref.newroom": "x = 1"})[0])) == ["newroom"]


def test_no_circles_between_rooms():
    assert circles(rooms(graph()[0])) == []
    assert circles(rooms(graph(BAD_CIRCLE)[0])) == [["certified", "formats"]]


def test_no_circles_between_files_type_only_imports_included():
    assert circles(graph()[0]) == []
    assert ["deepgemm_ref.exact", "deepgemm_ref.formats"] in circles(graph(BAD_TYPE_ONLY)[0])


def test_every_import_goes_down_the_layers():
    assert layer_violations(rooms(graph()[0])) == []
    assert layer_violations(rooms(graph(BAD_UPWARD)[0])) == [("core", "golden")]


def test_no_kernel_family_imports_a_peer():
    assert ("gemm", "grouped") in layer_violations(rooms(graph(BAD_PEER)[0]))


def test_golden_drives_the_module_it_is_handed():
    assert ("golden", "__init__") in layer_violations(rooms(graph(BAD_FACE)[0]))


def test_no_module_imports_another_rooms_private_names():
    assert private_cross_room_imports(*graph()) == []
    assert private_cross_room_imports(*graph(BAD_PRIVATE)) == [
        ("deepgemm_ref.attention.logits", "deepgemm_ref.gemm", "_make_fp8_fp4_variant")]


def test_the_room_tower_has_at_most_nine_floors():
    fl = floors(rooms(graph()[0]))
    assert max(fl.values()) <= MAX_FLOORS, sorted(fl.items(), key=lambda kv: -kv[1])
    assert max(floors(rooms(graph(BAD_TOWER)[0])).values()) > MAX_FLOORS


def test_floors_merge_circles():
    """A circle is one floor: the five rooms of a circle stacked on a ground room give two floors."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"e"}, "e": {"a", "ground"}, "ground": set()}
    assert floors(g) == {"a": 2, "b": 2, "c": 2, "d": 2, "e": 2, "ground": 1}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_stands_on_the_toolkit(family):
    """A family imports the toolkit layer or below: nothing of the face, golden or tools."""
    ws = rooms(graph()[0])[family]
    top = max(layer_of(w) for w in ws)  # type: ignore[type-var]
    assert LAYERS[top][0] in ("base", "numerics", "toolkit"), ws


def report() -> str:  # pragma: no cover - a report for humans
    edges, _ = graph()
    lines = []
    for title, g in (("rooms", rooms(edges)), ("files", edges)):
        fl = floors(g)
        lines.append(f"{title}: {max(fl.values())} floors, circles: {circles(g) or 'none'}")
        for f in range(max(fl.values()), 0, -1):
            names = sorted(v.replace("deepgemm_ref.", "") for v in fl if fl[v] == f)
            lines.append(f"  {f:2d}  {' '.join(names)}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(report())
