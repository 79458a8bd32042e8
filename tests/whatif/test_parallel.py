"""The what-if's two replays side by side in two processes read exactly as one after the
other (``compare._two_sides``): the week's demand on the test estate and on a head that
lowers team-a's limit, every figure of both sides compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler.api import compile_dir
from compiler.compiled import CompiledEstate
from klique_util.demand import to_csv
from kliqued.whatif import compare
from kliqued.whatif.demand import read_demand

from .test_whatif import ESTATE, LOWER_A, repo_with
from .week import week


def _estate(path: Path) -> CompiledEstate:
    estate = compile_dir(path).estate
    assert estate is not None
    return estate


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompiledEstate, CompiledEstate]:
    tmp = tmp_path_factory.mktemp("parallel")
    head = repo_with(tmp, LOWER_A) / "estate"
    return _estate(ESTATE), _estate(head)


def test_parallel_replays_give_the_same_comparison(
    tmp_path: Path, sides: tuple[CompiledEstate, CompiledEstate]
) -> None:
    demand = tmp_path / "week.csv"
    demand.write_text(to_csv(week()))
    rows = read_demand(str(demand))
    base, head = sides
    alone = compare.what_if(rows, base, head, str(demand), parallel=False)
    beside = compare.what_if(rows, base, head, str(demand), parallel=True)
    assert beside == alone
    # The two sides differ (team-a waits longer on the head): a swap would show.
    a = {r.name: r for r in alone.groups}["team-a"]
    assert a.base != a.head
