"""The compiler never raises, whatever the bytes: every file of the example estate cut off,
flipped, or with keys deleted and values of the wrong type, compiles to diagnostics.

The daemon compiles every revision that GitOps sees, including a file caught half-written by
an editor; an exception there used to leave the revision neither applied nor refused
(issue 9, finding 8)."""

from __future__ import annotations

import random
from io import StringIO
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from compiler.api import CompileResult, SourceFile, compile_files, read_dir
from tests.harness.examples import examples

ESTATE = Path(__file__).resolve().parents[2] / "estate"
FILES = read_dir(ESTATE)
STEP = 97
"""Cut points every STEP bytes (a prime, so cuts fall at every column over the files)."""


def compile_with(index: int, data: bytes) -> CompileResult:
    files = list(FILES)
    files[index] = SourceFile(files[index].path, data)
    return compile_files(files)


def assert_refused_or_valid(result: CompileResult) -> None:
    """A compile that does not raise must still say what it found: no estate comes with at
    least one error, and an estate with none."""
    if result.estate is None:
        assert result.errors, "no estate, yet no error says why"
    else:
        assert not result.errors


def test_the_truncated_policy_file_of_the_finding_is_refused_with_its_place() -> None:
    i = next(i for i, f in enumerate(FILES) if f.path.endswith("policies/ai-lab.yaml"))
    data = FILES[i].data
    cut = data.index(b"  - name: llm-research") + len(b"  - name: llm-research\n    de")
    result = compile_with(i, data[:cut])
    assert result.estate is None
    assert [d.code for d in result.errors] == ["yaml-syntax"]
    assert result.errors[0].pos is not None
    assert result.errors[0].pos.file.endswith("policies/ai-lab.yaml")


@pytest.mark.parametrize("index", range(len(FILES)), ids=[Path(f.path).name for f in FILES])
def test_every_file_cut_every_n_bytes(index: int) -> None:
    data = FILES[index].data
    for cut in range(0, len(data), STEP):
        assert_refused_or_valid(compile_with(index, data[:cut]))


def _dump(root: object) -> bytes:
    y = YAML()
    buf = StringIO()
    y.dump(root, buf)
    return buf.getvalue().encode()


def _paths(node: object, path: tuple = ()) -> list[tuple]:
    """Every key or item path below the root of a YAML tree."""
    out: list[tuple] = []
    if isinstance(node, CommentedMap):
        for k in node:
            out.append((*path, k))
            out += _paths(node[k], (*path, k))
    elif isinstance(node, CommentedSeq):
        for i, item in enumerate(node):
            out.append((*path, i))
            out += _paths(item, (*path, i))
    return out


WRONG = [None, 0, -1, 1.5, True, "", "x", "1e400", [], [1, "a"], {}, {"a": 1}, 10**30]


def mutate_tree(data: bytes, rng: random.Random, how: str) -> bytes:
    y = YAML()
    root = y.load(data)
    paths = _paths(root)
    if not paths:
        return data
    path = rng.choice(paths)
    parent = root
    for step in path[:-1]:
        parent = parent[step]
    if how == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(WRONG)
    return _dump(root)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, len(FILES) - 1),
    st.sampled_from(["cut", "flip", "delete", "retype"]),
    st.integers(0, 2**32 - 1),
)
def test_any_mutation_of_any_file_gives_diagnostics(index: int, how: str, seed: int) -> None:
    rng = random.Random(seed)
    data = FILES[index].data
    if how == "cut":
        data = data[: rng.randrange(len(data) + 1)]
    elif how == "flip":
        raw = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        data = bytes(raw)
    else:
        data = mutate_tree(data, rng, how)
    assert_refused_or_valid(compile_with(index, data))
