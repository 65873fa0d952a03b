"""The package's structure as drawn from its imports: no circles, kernels on one floor, no private reach-ins.

The graph is built from the source (``ast``), not by importing: every ``import`` statement of a
``deepgemm_ref`` module counts, at module level or inside a function (a late import is still a
dependency), except those under ``if TYPE_CHECKING:``.  Importing ``a.b.c`` from outside ``a.b``
also runs ``a.b``'s ``__init__``, so that package counts as a dependency too.

Run ``python tests/test_imports.py`` to print the graph's facts (floors, cycles).
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "deepgemm_ref"

#: The kernel families: each validates, translates and calls the executor; none imports another.
FAMILIES = ("deepgemm_ref.gemm", "deepgemm_ref.grouped", "deepgemm_ref.einsum", "deepgemm_ref.attention",
            "deepgemm_ref.mega")
#: Modules above the kernels: they assemble namespaces or run workflows on top of the kernels.
ABOVE = ("deepgemm_ref", "deepgemm_ref._C", "deepgemm_ref.utils", "deepgemm_ref.golden", "deepgemm_ref.cli",
         "deepgemm_ref.testing", "deepgemm_ref.strategies", "deepgemm_ref.pytest_plugin")
#: Cycles outside this work's rooms, each with the issue that removes it (delete the entry then).


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements, skipping the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _with_parents(target: str, importer: str, known: dict[str, Path]) -> set[str]:
    """``target`` and the packages whose ``__init__`` importing it runs (those not above ``importer``)."""
    out = {target}
    parts = target.split(".")
    for i in range(2, len(parts)):
        parent = ".".join(parts[:i])
        if parent in known and not (importer == parent or importer.startswith(parent + ".")):
            out.add(parent)
    return out


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once per run (the four tests read the same sources)."""
    return ast.parse(path.read_text())


def graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """(module -> the package modules it imports, [(importer, module, private name imported)])."""
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    private: list[tuple[str, str, str]] = []
    for mod, path in known.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(_tree(path)):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names if a.name.startswith("deepgemm_ref")]
            else:
                base = _resolve(mod, is_pkg, node)
                if not base.startswith("deepgemm_ref"):
                    continue
                targets = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in known:
                        targets.append((sub, None))
                    else:
                        targets.append((base, alias.name))
            for target, name in targets:
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target == mod:
                    continue
                edges[mod] |= _with_parents(target, mod, known) - {mod}
                if name is not None and name.startswith("_") and not name.startswith("__"):
                    private.append((mod, target, name))
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
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
        for w in sorted(edges[v]):
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


def floors(edges: dict[str, set[str]]) -> dict[str, int]:
    """Floor of every module: 0 without package imports, else one above its highest import."""
    memo: dict[str, int] = {}

    def floor(v: str, seen: frozenset[str]) -> int:
        if v in memo:
            return memo[v]
        if v in seen:  # a cycle: no floor (reported by cycles())
            return 0
        f = 1 + max((floor(w, seen | {v}) for w in edges[v]), default=-1)
        memo[v] = f
        return f

    for v in edges:
        floor(v, frozenset())
    return memo


def _family(mod: str) -> str | None:
    return next((f for f in FAMILIES if mod == f or mod.startswith(f + ".")), None)


def _in(mod: str, group: str) -> bool:
    return mod == group or mod.startswith(group + ".")


def _above(mod: str) -> bool:
    return mod == "deepgemm_ref" or any(_in(mod, a) for a in ABOVE[1:])


def foundations(edges: dict[str, set[str]]) -> set[str]:
    """Every module that is neither a kernel family nor above the kernels."""
    return {m for m in edges if _family(m) is None and not _above(m)}


def family_floors(edges: dict[str, set[str]]) -> dict[str, int]:
    """A family's base: the floor of the highest module outside it that any of its modules imports."""
    fl = floors(edges)
    out = {}
    for fam in FAMILIES:
        deps = {w for v in edges if _in(v, fam) for w in edges[v] if not _in(w, fam)}
        out[fam] = max((fl[w] for w in deps), default=-1)
    return out


def test_there_are_no_import_circles():
    found = cycles(graph()[0])
    assert found == []


def test_no_kernel_family_imports_another():
    edges, _ = graph()
    bad = sorted((v, w) for v in edges for w in edges[v]
                 if _family(v) is not None and _family(w) is not None and _family(v) != _family(w))
    assert not bad, bad


def test_no_module_imports_another_rooms_private_names():
    """A ``_name`` is imported only inside the package that defines it (a family, or a room such
    as toolkit or layout); top-level modules are rooms of their own."""
    known = modules()
    _, private = graph()

    def package(mod: str) -> str:
        return mod if known[mod].name == "__init__.py" else mod.rsplit(".", 1)[0]

    bad = [(m, t, n) for m, t, n in private
           if package(t) == "deepgemm_ref" or not (m == package(t) or m.startswith(package(t) + "."))]
    assert not bad, bad


def test_every_kernel_family_stands_on_the_same_foundations():
    """The families form one floor: each imports only foundation modules (toolkit, layout, core,
    executor and what they stand on), and no foundation module imports a family or what is above."""
    edges, _ = graph()
    base = foundations(edges)
    fl = floors(edges)
    for v in edges:
        fam = _family(v)
        for w in edges[v]:
            if fam is not None and not _in(w, fam):
                assert w in base, (v, w)
            if v in base:
                assert w in base, (v, w)
    top = max(fl[m] for m in base)
    assert all(b <= top for b in family_floors(edges).values())
    for must in ("deepgemm_ref.core", "deepgemm_ref.executor", "deepgemm_ref.toolkit.operands", "deepgemm_ref.layout"):
        assert must in base


if __name__ == "__main__":  # pragma: no cover - a report for humans
    e, priv = graph()
    fl = floors(e)
    print("cycles:", cycles(e) or "none")
    print("foundation floor (top):", max(fl[m] for m in foundations(e)))
    print("family bases:", family_floors(e))
    for m in sorted(fl, key=lambda m: (fl[m], m)):
        print(f"{fl[m]:3d}  {m}  <- {', '.join(sorted(x.replace('deepgemm_ref.', '') for x in e[m]))}")
