"""The registry of expectation kinds: one entry from which loading and checking derive."""

from __future__ import annotations

import re
from pathlib import Path

from ruamel.yaml import YAML

from kliqued.sim.kinds import KINDS
from kliqued.sim.scenario import EXPECT_KEYS
from tests.conftest import REPO, require_shared


def _documented_kinds(doc: Path) -> set[str]:
    """The keys of every expectation in the document's YAML examples."""
    kinds: set[str] = set()
    for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S):
        data = YAML(typ="safe").load(block)
        for ex in (data or {}).get("expect") or [] if isinstance(data, dict) else []:
            kinds |= set(ex) - {"at"}
    return kinds


def test_every_kind_the_spec_documents_is_registered() -> None:
    documented = _documented_kinds(require_shared("spec", "scenarios.md"))
    assert {"running", "queue", "waiting_reason"} <= documented  # the parse works
    assert documented <= set(KINDS), documented - set(KINDS)


def test_every_kind_our_docs_document_is_registered() -> None:
    documented = _documented_kinds(REPO / "docs" / "simulation.md")
    assert "started" in documented  # the parse works
    assert documented <= set(KINDS), documented - set(KINDS)


def test_loading_accepts_exactly_the_registered_kinds() -> None:
    assert EXPECT_KEYS == tuple(KINDS)
    for kind in KINDS.values():
        assert kind.subject in ("group", "pool", "compute resource", "task id", "policy"), kind.name
        assert callable(kind.parse) and callable(kind.check), kind.name
