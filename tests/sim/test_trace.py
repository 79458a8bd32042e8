"""``kliqued simulate --trace``: replay of a CSV trace, its report, and bad input."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from compiler.api import compile_dir
from kliqued.cli import main
from kliqued.sim.trace import Progress, TraceError, load_trace, replay
from tests.harness.typed import present

ESTATE = """
pools:
  - {name: p, kind: baremetal, capacity: 4, gpu_type: h100}
profiles:
  - {name: gpu1, gpus: 1, pools: [p], policies: [a, b]}
  - {name: any, gpus: {from_task: gpus, default: 1, max: 8}, pools: [p], policies: [a],
     queueing: best_effort}
policies:
  - {name: a, group: a, reservation: 2, limit: 8, budget: {hours: 3, period: day}}
  - {name: b, group: b, reservation: 0, limit: 4}
groups:
  - {name: a, users: [alice], projects: [x]}
  - {name: b, users: [bob]}
pricing:
  - {gpu_type: h100, per_gpu_hour: 2, effective_from: "2026-01-01T00:00:00Z"}
"""

HEADER = "id,submit,resource,user,project,gpus,runtime\n"

# Four GPUs. b takes them all (b-5 waits at b's limit); at 30m a's 2-GPU task, within a's
# reservation, reclaims the two newest (b-4, b-3); they return when it ends at 1h30m; b-5
# starts when b-1 and b-2 end at 2h and ends at 4h.
TRACE = (
    HEADER
    + """b-1,0,b/gpu1,bob,,,2h
b-2,0,b/gpu1,bob,,,2h
b-3,0,b/gpu1,bob,,,7200
b-4,0,b/gpu1,bob,,,2h
b-5,0,b/gpu1,bob,,,2h
a-1,1800,a/any,alice,x,2,1h
"""
)


@pytest.fixture
def estate_dir(tmp_path: Path) -> Path:
    d = tmp_path / "estate"
    d.mkdir()
    (d / "estate.yaml").write_text(ESTATE)
    return d


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _replay(estate_dir: Path, trace: Path, **kw):
    est = compile_dir(estate_dir).estate
    assert est is not None
    return replay(load_trace(str(trace), est), est, **kw).data


def test_report_checked_by_hand(tmp_path: Path, estate_dir: Path) -> None:
    d = _replay(estate_dir, _write(tmp_path, TRACE))
    assert d["start"] == "2026-01-05T00:00:00Z" and d["end"] == "2026-01-05T04:00:00Z"
    assert d["duration_h"] == 4.0 and not d["stopped_at_horizon"]
    b, a, ov = d["groups"]["b"], d["groups"]["a"], d["overall"]
    # b: 2+2 (b-1, b-2) + 0.5+2 twice (b-3, b-4 restart) + 2 (b-5) GPU-hours; a: 2 GPUs x 1 h
    assert b["gpu_hours"] == 11.0 and a["gpu_hours"] == 2.0 and ov["gpu_hours"] == 13.0
    # 13 GPU-hours on 4 GPUs over 4 hours
    assert d["pools"]["p"] == {"capacity": 4.0, "gpu_hours": 13.0, "utilisation": 0.8125}
    assert b["utilisation"] == {"p": 0.6875} and a["utilisation"] == {"p": 0.125}
    # waits: b-5 2 h, everything else placed at once
    assert b["wait_s"] == {"p50": 0.0, "p95": 7200.0, "max": 7200.0}
    assert a["wait_s"] == {"p50": 0.0, "p95": 0.0, "max": 0.0}
    assert ov["wait_s"] == {"p50": 0.0, "p95": 7200.0, "max": 7200.0}
    assert b["preemptions"] == {"reclaimed": 2, "rebalanced": 0, "budget": 0}
    assert ov["preemptions"] == {"reclaimed": 2, "rebalanced": 0, "budget": 0}
    # b-3 and b-4 had run 30m without a checkpoint when reclaimed: 2 x 1 GPU x 0.5 h lost
    assert b["lost_gpu_hours"] == 1.0 and a["lost_gpu_hours"] == 0.0
    assert ov["lost_gpu_hours"] == 1.0
    # budget hours: weight 1 per task, whatever its size
    assert a["budget_hours"] == 1.0 and b["budget_hours"] == 11.0
    assert a["budget"] == {"hours": 3.0, "period": "day"} and b["budget"] is None
    assert ov["budget_exhaustions"] == 0
    assert ov["tasks"] == 6 and ov["placed"] == 6 and ov["unfinished"] == 0


FAIR_ESTATE = """
settings:
  lending: {order: fair}
pools:
  - {name: p, kind: baremetal, capacity: 4, gpu_type: h100}
profiles:
  - {name: gpu1, gpus: 1, pools: [p], policies: [a, b]}
policies:
  - {name: a, group: a, reservation: 0, limit: 4}
  - {name: b, group: b, reservation: 0, limit: 4}
groups:
  - {name: a, users: [alice]}
  - {name: b, users: [bob]}
pricing:
  - {gpu_type: h100, per_gpu_hour: 2, effective_from: "2026-01-01T00:00:00Z"}
"""


def test_rebalances_and_lost_work_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # order: fair. a borrows all 4 GPUs at 0s (checkpoint every 45m); at 1h b (share 0)
    # rebalances two of a's tasks away (a's share 4 -> 2), each 15m past its last checkpoint:
    # 2 x 1 GPU x 0.25 h = 0.5 lost GPU-hours, on a.
    d = tmp_path / "estate"
    d.mkdir()
    (d / "estate.yaml").write_text(FAIR_ESTATE)
    text = (
        HEADER.rstrip("\n")
        + ",checkpoint\n"
        + "".join(f"a-{i},0,a/gpu1,alice,,,2h,45m\n" for i in range(1, 5))
        + "".join(f"b-{i},3600,b/gpu1,bob,,,1h,45m\n" for i in range(1, 3))
    )
    trace = _write(tmp_path, text)
    r = _replay(d, trace)
    a, b, ov = r["groups"]["a"], r["groups"]["b"], r["overall"]
    assert a["preemptions"] == {"reclaimed": 0, "rebalanced": 2, "budget": 0}
    assert b["preemptions"] == {"reclaimed": 0, "rebalanced": 0, "budget": 0}
    assert a["lost_gpu_hours"] == 0.5 and b["lost_gpu_hours"] == 0.0
    assert ov["lost_gpu_hours"] == 0.5 and ov["preemptions"]["rebalanced"] == 2
    assert main(["simulate", "--estate", str(d), "--trace", str(trace), "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if line.startswith("group "))
    assert "rebal." in head and "lost GPU-h" in head
    row_a = next(line for line in lines if line.startswith("a ")).split()
    cols = head.split()
    # the header's "wait p50" and "lost GPU-h" are two words each; each value one
    assert row_a[cols.index("rebal.") - 1] == "2"
    assert row_a[cols.index("lost") - 1] == "0.5"


def test_a_finished_replay_is_not_cut_by_the_horizon(tmp_path: Path, estate_dir: Path) -> None:
    # Everything ends at 4h; the engine's next moment (a's budget day) is past --until.
    est = present(compile_dir(estate_dir).estate)
    tr = load_trace(str(_write(tmp_path, TRACE)), est)
    d = replay(tr, est, until=tr.start + 5 * 3_600_000).data
    assert not d["stopped_at_horizon"] and d["end"] == "2026-01-05T04:00:00Z"
    assert d["overall"]["unfinished"] == 0


def test_budget_exhaustion_and_checkpoint(tmp_path: Path, estate_dir: Path) -> None:
    # 5 h on a 3 h/day budget: runs out at 3h (preempted, checkpointed at 3h), resumes at
    # the next day's start and ends at 26h.
    text = HEADER.rstrip("\n") + ",checkpoint\na-1,0,a/any,alice,x,1,5h,1h\n"
    d = _replay(estate_dir, _write(tmp_path, text))
    a = d["groups"]["a"]
    assert a["budget_exhaustions"] == 1
    assert a["preemptions"] == {"reclaimed": 0, "rebalanced": 0, "budget": 1}
    # checkpointed at 3h, the moment its budget ran out: nothing lost
    assert a["lost_gpu_hours"] == 0.0
    assert a["budget_hours"] == 5.0 and a["gpu_hours"] == 5.0
    assert d["end"] == "2026-01-06T02:00:00Z" and a["unfinished"] == 0


def test_work_that_never_finishes_stops_at_the_horizon(tmp_path: Path, estate_dir: Path) -> None:
    # Without a checkpoint a 5 h task restarts from zero every day: it can never finish.
    trace = _write(tmp_path, HEADER + "a-1,0,a/any,alice,x,1,5h\n")
    est = present(compile_dir(estate_dir).estate)
    tr = load_trace(str(trace), est)
    d = replay(tr, est, until=tr.start + 50 * 3_600_000).data
    a = d["groups"]["a"]
    assert d["stopped_at_horizon"] and a["unfinished"] == 1
    assert a["budget_exhaustions"] == 2 and a["preemptions"]["budget"] == 2
    assert d["end"] == "2026-01-07T02:00:00Z"


def test_a_task_no_pool_can_hold_ends_the_replay(tmp_path: Path, estate_dir: Path) -> None:
    # 6 GPUs is within a's limit and the profile's max, but no pool has 6.
    d = _replay(
        estate_dir, _write(tmp_path, HEADER + "a-1,0,a/any,alice,x,6,1h\nb-1,10,b/gpu1,bob,,,1h\n")
    )
    assert d["groups"]["a"]["never_placed"] == 1 and d["groups"]["a"]["unfinished"] == 1
    assert d["groups"]["a"]["wait_s"]["p50"] is None
    assert d["end"] == "2026-01-05T01:00:10Z"


def test_rfc3339_times_and_start(tmp_path: Path, estate_dir: Path) -> None:
    text = HEADER + (
        "b-1,2026-03-02T08:00:00Z,b/gpu1,bob,,,1h\nb-2,2026-03-02T08:30:00Z,b/gpu1,bob,,,90m\n"
    )
    d = _replay(estate_dir, _write(tmp_path, text))
    assert d["start"] == "2026-03-02T08:00:00Z" and d["end"] == "2026-03-02T10:00:00Z"
    assert d["overall"]["gpu_hours"] == 2.5


def test_cli_text_and_json_are_deterministic(
    tmp_path: Path, estate_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _write(tmp_path, TRACE)
    args = ["simulate", "--estate", str(estate_dir), "--trace", str(trace), "-q"]
    assert main(args + ["--json"]) == 0
    first = capsys.readouterr().out
    assert main(args + ["--json"]) == 0
    assert capsys.readouterr().out == first
    data = json.loads(first)
    assert set(data["overall"]) >= {
        "wait_s",
        "preemptions",
        "gpu_hours",
        "budget_hours",
        "budget_exhaustions",
        "utilisation",
    }
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "81.2%" in text and "2h00m00s" in text
    assert text.splitlines()[0].startswith(f"Replay of {trace}: 6 tasks")


BAD = [
    ("b-1,0,b/nope,bob,,,1h", 2, "unknown compute resource 'b/nope'"),
    ("b-1,0,b/gpu1,alice,,,1h", 2, "user 'alice' is not in the users of group 'b'"),
    ("a-1,0,a/any,alice,x,9,1h", 2, "above the maximum of profile 'any' (8)"),
    ("b-1,0,b/gpu1,bob,,2,1h", 2, "has a fixed size"),
    ("a-1,0,a/any,alice,y,1,1h", 2, "project 'y'"),
    ("b-1,60,b/gpu1,bob,,,1h\nb-2,30,b/gpu1,bob,,,1h", 3, "rows out of time order"),
    ("b-1,soon,b/gpu1,bob,,,1h", 2, "unparsable time 'soon'"),
    ("b-1,2026-13-01T00:00:00Z,b/gpu1,bob,,,1h", 2, "unparsable time"),
    ("a-1,0,a/any,alice,,two,1h", 2, "gpus: expected a number, found 'two'"),
    ("b-1,0,b/gpu1,bob,,,forever", 2, "runtime: unparsable duration 'forever'"),
    ("b-1,0,b/gpu1,bob,,,", 2, "runtime: unparsable duration ''"),
    ("b-1,0,b/gpu1,bob,,,1h\nb-1,5,b/gpu1,bob,,,1h", 3, "task id 'b-1' is already used"),
    ("b-1,0,b/gpu1,bob,,1h", 2, "expected 7 fields"),
]


@pytest.mark.parametrize("row,line,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_rows_exit_2_with_file_and_line(
    tmp_path: Path,
    estate_dir: Path,
    capsys: pytest.CaptureFixture[str],
    row: str,
    line: int,
    message: str,
) -> None:
    trace = _write(tmp_path, HEADER + row + "\n")
    code = main(["simulate", "--estate", str(estate_dir), "--trace", str(trace)])
    out = capsys.readouterr()
    assert code == 2
    assert f"{trace}:{line}: error[trace]: " in out.err and message in out.err, out.err
    assert "invalid trace" in out.err and "not run" in out.err
    assert out.out == ""  # nothing half-run: no report


def test_group_limit_is_checked(tmp_path: Path) -> None:
    d = tmp_path / "e"
    d.mkdir()
    (d / "e.yaml").write_text(
        ESTATE.replace("reservation: 2, limit: 8", "reservation: 2, limit: 5")
    )
    est = present(compile_dir(d).estate)
    with pytest.raises(TraceError) as exc:
        load_trace(str(_write(tmp_path, HEADER + "a-1,0,a/any,alice,x,6,1h\n")), est)
    assert "t.csv:2: error[trace]: gpus: gpus 6 is above the limit of group 'a' (5)" in str(
        exc.value
    )


def test_missing_column_and_every_error_listed(
    tmp_path: Path, estate_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _write(tmp_path, "id,submit,resource,user,gpus\nb-1,0,b/gpu1,bob,\n")
    assert main(["simulate", "--estate", str(estate_dir), "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert f"{trace}:1: error[trace]: missing columns 'project', 'runtime'" in err
    # every bad row is reported, not just the first
    rows = "".join(f"b-{i},0,b/nope,bob,,,1h\n" for i in range(3))
    trace = _write(tmp_path, HEADER + rows + "b-9,0,b/gpu1,bob,,,1h\n")
    assert main(["simulate", "--estate", str(estate_dir), "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert all(f"{trace}:{n}:" in err for n in (2, 3, 4)) and "(3 errors)" in err


def test_scenarios_and_trace_are_exclusive(
    tmp_path: Path, estate_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _write(tmp_path, TRACE)
    assert main(["simulate", "x.yaml", "--trace", str(trace)]) == 2
    assert main(["simulate"]) == 2
    assert "no scenario files" in capsys.readouterr().err


def test_progress_lines_without_a_terminal() -> None:
    out = io.StringIO()
    p = Progress(out, 100)
    p.update(30, 30, "+1h")
    assert out.getvalue() == ""  # quiet during the first second
    p.t0 -= 2.0
    for done in range(0, 101, 5):
        p.update(done, done, "+1h")
    p.finish(100)
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[1].split("%")[0].strip() for ln in lines[:-1]] == [
        str(x) for x in range(10, 100, 10)
    ]
    assert "events/s" in lines[0] and lines[-1].startswith("replay: done, 100 events")
