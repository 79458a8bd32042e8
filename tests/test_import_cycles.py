"""No import cycle anywhere in the tree (issue 27): compiler, klique_util, kliqued, workers.

The graph is grimp's, as import-linter builds it: every import counts, those inside functions
and under ``TYPE_CHECKING`` too (a cycle of annotations is still two modules that cannot be
read, moved or tested apart). A cycle is a strongly connected component of more than one
module; each is printed with one loop through it, so the failure says where to cut.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import grimp
import pytest

PACKAGES = ("compiler", "klique_util", "kliqued", "workers")

KNOWN: set[frozenset[str]] = set()
"""Cycles allowed for now, each exactly as it stands: one that grows fails too. Empty since
the engine's, the ledger's and the autoscaler's were broken (issue 27): keep it so."""


@functools.lru_cache(maxsize=1)
def tree() -> grimp.ImportGraph:
    """The tree's graph, built once per run and without grimp's cache (a cache left by an
    older checkout once reported cycles the tree no longer had), of the packages beside this
    test's folder (``tests/workers`` is not ``workers``)."""
    root = Path(__file__).resolve().parent.parent
    for p in PACKAGES:
        spec = importlib.util.find_spec(p)
        assert spec is not None and spec.origin is not None, p
        assert Path(spec.origin).resolve().parent.parent == root, (p, spec.origin)
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative: the
    tree has ~700 modules, deeper than a recursion should go)."""
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            succ = adj.get(v, [])
            if i < len(succ):
                work.append((v, i + 1))
                w = succ[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
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
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def loop(graph: grimp.ImportGraph, comp: list[str]) -> str:
    """One loop through the component, ``a -> b -> ... -> a``, with the line of each import."""
    members = set(comp)
    start = comp[0]
    for nxt in sorted(graph.find_modules_directly_imported_by(start) & members):
        path = graph.find_shortest_chain(importer=nxt, imported=start)
        if path is None:
            continue
        chain = [start, *path]
        steps = []
        for a, b in zip(chain, chain[1:]):
            details = graph.get_import_details(importer=a, imported=b)
            line = details[0]["line_number"] if details else "?"
            steps.append(f"{a} -> {b} (l.{line})")
        return "\n    ".join(steps)
    return " -> ".join(comp)


def test_no_import_cycle() -> None:
    graph = tree()
    found = cycles(graph)
    new = [c for c in found if frozenset(c) not in KNOWN]
    report = "\n".join(f"- {len(c)} modules: {', '.join(c)}\n    {loop(graph, c)}" for c in new)
    assert not new, f"import cycles (docs/architecture.md, the rooms):\n{report}"


def test_the_known_cycles_are_still_there() -> None:
    """An allowed cycle that is gone is taken off :data:`KNOWN`, so it cannot come back."""
    found = {frozenset(c) for c in cycles(tree())}
    gone = [sorted(c) for c in KNOWN if c not in found]
    assert not gone, f"fixed, take them off KNOWN: {gone}"


def test_the_check_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: two modules importing each other (one of them only for types, one
    inside a function) are one cycle."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclepkg import b\n"
    )
    (pkg / "b.py").write_text("def f():\n    from cyclepkg import a\n")
    (pkg / "c.py").write_text("from cyclepkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclepkg", cache_dir=None)
    assert cycles(graph) == [["cyclepkg.a", "cyclepkg.b"]]
    assert "cyclepkg.a -> cyclepkg.b" in loop(graph, ["cyclepkg.a", "cyclepkg.b"])
