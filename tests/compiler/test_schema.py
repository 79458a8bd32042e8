"""The JSON Schema is generated from the models, current, and accepts the example estate."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from compiler.api import read_dir
from compiler.loader import load_yaml, to_plain
from compiler.schema import estate_schema, estate_schema_text

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "schemas" / "estate.schema.json"
ESTATE_FILES = sorted(p for p in (REPO / "estate").rglob("*") if p.suffix in (".yaml", ".yml"))


def test_committed_schema_is_current() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == estate_schema_text(), (
        "schemas/estate.schema.json is stale: run `make schema` and commit it"
    )


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(estate_schema())


@pytest.mark.parametrize("path", ESTATE_FILES, ids=[str(p.relative_to(REPO)) for p in ESTATE_FILES])
def test_example_estate_files_match_the_schema(path: Path) -> None:
    loaded = load_yaml(str(path), path.read_bytes())
    assert loaded.ok, loaded.diagnostics
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    errors = [
        f"{'/'.join(map(str, e.path))}: {e.message}"
        for e in validator.iter_errors(to_plain(loaded.root) or {})
    ]
    assert errors == []


@pytest.mark.parametrize("path", ESTATE_FILES, ids=[str(p.relative_to(REPO)) for p in ESTATE_FILES])
def test_example_estate_files_carry_the_modeline(path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    target = (path.parent / first.split("$schema=", 1)[1].strip()).resolve()
    assert target == SCHEMA_FILE.resolve()


def test_schema_rejects_what_the_compiler_rejects() -> None:
    validator = jsonschema.Draft202012Validator(estate_schema())
    bad = {"pools": [{"name": "p", "kind": "k8s", "capacity": 1, "gpu_type": "h", "capactiy": 2}]}
    messages = [e.message for e in validator.iter_errors(bad)]
    assert any("k8s" in m for m in messages) and any("capactiy" in m for m in messages)


def test_example_estate_exists() -> None:
    assert read_dir(REPO / "estate"), "estate/ must hold the example estate"
