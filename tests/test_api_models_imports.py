"""The API's models (``kliqued/api_models``) import pydantic and ``klique_util`` only (issue 27,
item 3): the daemon, the SDK and the MCP tools share them, so the SDK (and a worker host
through it) must be able to load them without any of the daemon.

``lint-imports`` holds the contract, listing every package of ``kliqued`` but the models (it
cannot forbid their own parent). These tests keep that list whole when a package is added,
and read the graph itself (every import, also inside functions), whatever the list says.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.test_import_cycles import tree

ROOT = Path(__file__).resolve().parent.parent
MODELS = "kliqued.api_models"


def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["source_modules"] == [MODELS])


def test_the_contract_forbids_every_other_package_of_kliqued() -> None:
    packages = {
        f"kliqued.{p.stem}"
        for p in (ROOT / "kliqued").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py")
    } - {"kliqued.__init__", MODELS}
    forbidden = set(_contract()["forbidden_modules"])
    assert packages - forbidden == set(), "add these to the api_models contract in pyproject.toml"
    assert {"compiler", "workers"} <= forbidden


def test_the_models_import_nothing_of_klique_but_klique_util() -> None:
    graph = tree()
    outside = {
        (m, imported)
        for m in graph.find_descendants(MODELS) | {MODELS}
        for imported in graph.find_modules_directly_imported_by(m)
        if not imported.startswith((MODELS + ".", "klique_util"))
        and imported != MODELS
        and imported.split(".")[0] in ("compiler", "kliqued", "workers")
    }
    assert outside == set()
