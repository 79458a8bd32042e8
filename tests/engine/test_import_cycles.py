"""The engine's modules import one another one way only (issue 27): grimp's graph counts
every import, those under ``TYPE_CHECKING`` and inside functions too, so a cycle cannot hide
behind a deferred import."""

from __future__ import annotations

import grimp


def test_engine_has_no_import_cycle() -> None:
    graph = grimp.build_graph("kliqued", include_external_packages=False)
    mods = sorted(m for m in graph.modules if m.startswith("kliqued.engine"))
    cycles = sorted(
        {
            tuple(sorted((a, b)))
            for a in mods
            for b in graph.find_modules_directly_imported_by(a)
            if b.startswith("kliqued.engine") and graph.chain_exists(importer=b, imported=a)
        }
    )
    assert cycles == [], (
        f"import cycles in kliqued.engine (each pair imports the other, "
        f"directly or through others): {cycles}"
    )
