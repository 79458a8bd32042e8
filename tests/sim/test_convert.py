"""``kliqued trace convert``: public traces mapped onto an estate's compute resources."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from compiler.api import compile_dir
from kliqued.cli import main
from kliqued.sim.convert import ConvertError, convert
from kliqued.sim.trace import load_trace, replay
from tests.conftest import ESTATE, require_shared

SMALL = """
pools:
  - {name: p, kind: baremetal, capacity: 8, gpu_type: h100}
profiles:
  - {name: any, gpus: {from_task: gpus, default: 1, max: 4}, pools: [p], policies: [a],
     queueing: best_effort}
  - {name: cpu, gpus: 0, time_weight: 0, pools: [p], policies: [a]}
  - {name: one, gpus: 1, pools: [p], policies: [b, d]}
  - {name: two, gpus: 2, pools: [p], policies: [b]}
  - {name: four, gpus: 4, pools: [p], policies: [b]}
  - {name: half, gpus: 0.5, pools: [p], policies: [b]}
  - {name: quarter, gpus: 0.25, pools: [p], policies: [b, c]}
policies:
  - {name: a, group: a, reservation: 1, limit: 8}
  - {name: b, group: b, reservation: 1, limit: 4}
  - {name: c, group: c, reservation: 0, limit: 1}
  - {name: d, group: d, reservation: 0, limit: 2}
groups:
  - {name: a, users: [ann, amy]}
  - {name: b, users: [bob]}
  - {name: c}
  - {name: d, users: [dan]}
pricing:
  - {gpu_type: h100, per_gpu_hour: 2, effective_from: "2026-01-01T00:00:00Z"}
"""

PHILLY_HEADER = (
    "job_id,user,num_gpu,submit_time,iterations,model_name,duration,interval,"
    "expect_time_list,expect_value_list,best_effort,job_type\n"
)
OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


@pytest.fixture
def small(tmp_path: Path):
    d = tmp_path / "estate"
    d.mkdir()
    (d / "e.yaml").write_text(SMALL)
    est = compile_dir(d).estate
    assert est is not None
    return d, est


def _philly(tmp_path: Path, jobs: list[tuple[str, str, int, int, int]]) -> Path:
    p = tmp_path / "philly.csv"
    p.write_text(
        PHILLY_HEADER
        + "".join(f"{j},{u},{n},{s},1,m,{d},1,1,1,0,strict\n" for j, u, n, s, d in jobs)
    )
    return p


def _rows(conv) -> list[list[str]]:
    return list(csv.reader(io.StringIO(conv.csv_text())))[1:]


def test_default_mapping(tmp_path: Path, small) -> None:
    _, est = small
    # trace users sorted: u1 -> a, u2 -> b, u3 -> d, u4 -> a (c has no users)
    path = _philly(
        tmp_path,
        [
            ("1", "u1", 1, 5, 60),
            ("2", "u1", 0, 6, 60),
            ("3", "u1", 3, 7, 60),
            ("4", "u1", 6, 8, 60),  # above any's max: dropped
            ("5", "u2", 1, 9, 60),
            ("6", "u2", 3, 10, 60),  # b: exact, then smallest larger
            ("7", "u2", 0, 11, 60),
            ("8", "u2", 5, 12, 60),  # no 0-GPU profile; above limit
            ("9", "u3", 2, 13, 60),  # d: nothing of 2 GPUs
            ("10", "u4", 2, 1, 30),  # first by submit time
        ],
    )
    conv = convert("chronus-philly", str(path), est)
    assert {u: t.group for u, t in conv.targets.items()} == {
        "u1": "a",
        "u2": "b",
        "u3": "d",
        "u4": "a",
    }
    assert _rows(conv) == [
        ["10", "1", "a/any", "amy", "", "2", "30"],
        ["1", "5", "a/any", "ann", "", "1", "60"],
        ["2", "6", "a/cpu", "amy", "", "", "60"],
        ["3", "7", "a/any", "ann", "", "3", "60"],
        ["5", "9", "b/one", "bob", "", "", "60"],
        ["6", "10", "b/four", "bob", "", "", "60"],
    ]
    assert conv.dropped == {
        "more GPUs than any profile of the group (or its pools) takes": 2,
        "0 GPUs and the group has no 0-GPU profile": 1,
        "more GPUs than the group's limit": 1,
    }
    text = conv.summary("out.csv")
    assert "wrote 6 tasks to out.csv" in text and "dropped 4 jobs" in text


def test_alibaba_fractions(tmp_path: Path, small) -> None:
    _, est = small
    path = tmp_path / "openb.csv"
    path.write_text(
        OPENB_HEADER + "pod-0,1,1,1,470,,LS,Running,0,100,0\n"
        "pod-1,1,1,1,200,,LS,Running,5,100,10\n"
        "pod-2,1,1,1,1000,,LS,Running,6,200,6\n"
        "pod-3,1,1,8,1000,,LS,Running,7,200,7\n"
        "pod-4,1,1,1,300,,LS,Pending,8,200,\n"
    )
    # every synthetic user to b, whose fixed fractional profiles are half and quarter
    mapping = tmp_path / "map.yaml"
    mapping.write_text("users:\n" + "".join(f"  openb-user-{i:02d}: b\n" for i in range(3)))
    conv = convert("alibaba-openb", str(path), est, str(mapping))
    assert [r[:3] + r[5:] for r in _rows(conv)] == [
        ["pod-0", "0", "b/half", "", "100"],  # 0.47: nearest fractional profile
        ["pod-1", "5", "b/quarter", "", "90"],  # 0.2: quarter; runs scheduled -> deleted
        ["pod-2", "6", "b/one", "", "194"],
    ]
    assert conv.dropped == {"more GPUs than the group's limit": 1}
    assert conv.skipped == {"pods never scheduled in the trace (no runtime)": 1}
    # on a from_task profile the task keeps its fraction
    mapping.write_text("users:\n" + "".join(f"  openb-user-{i:02d}: a\n" for i in range(3)))
    conv = convert("alibaba-openb", str(path), est, str(mapping))
    assert [(r[2], r[5]) for r in _rows(conv)][:3] == [
        ("a/any", "0.47"),
        ("a/any", "0.2"),
        ("a/any", "1"),
    ]


def test_mapping_file(tmp_path: Path, small) -> None:
    _, est = small
    path = _philly(tmp_path, [("1", "u1", 1, 0, 60), ("2", "u2", 1, 1, 60), ("3", "u3", 1, 2, 60)])
    mapping = tmp_path / "map.yaml"
    mapping.write_text("users:\n  u1: {resource: b/two, user: bob}\n  u2: d/one\n")
    conv = convert("chronus-philly", str(path), est, str(mapping))
    # u3 is not mapped: the default round-robin starts over for the unmapped users
    assert [r[2:4] for r in _rows(conv)] == [["b/two", "bob"], ["d/one", "dan"], ["a/any", "amy"]]
    mapping.write_text(
        "users:\n  u1: b/nope\n  u2: {group: c}\n  u3: {resource: b/one, user: ann}\n"
    )
    with pytest.raises(ConvertError) as exc:
        convert("chronus-philly", str(path), est, str(mapping))
    text = str(exc.value)
    assert "map.yaml:2: error[mapping]: u1: unknown compute resource 'b/nope'" in text
    assert "map.yaml:3:" in text and "map.yaml:4:" in text and "'ann'" in text


def test_cli_convert_and_bad_input(
    tmp_path: Path, small, capsys: pytest.CaptureFixture[str]
) -> None:
    d, _ = small
    path = _philly(tmp_path, [("1", "u1", 1, 0, 60), ("2", "u2", 2, 1, 60)])
    out = tmp_path / "out" / "t.csv"
    assert (
        main(
            [
                "trace",
                "convert",
                "--from",
                "chronus-philly",
                str(path),
                "--estate",
                str(d),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert "wrote 2 tasks" in capsys.readouterr().out
    assert main(["simulate", "--estate", str(d), "--trace", str(out), "-q"]) == 0
    capsys.readouterr()
    bad = tmp_path / "bad.csv"
    bad.write_text(PHILLY_HEADER + "1,u1,one,0,1,m,60,1,1,1,0,strict\n")
    assert (
        main(
            [
                "trace",
                "convert",
                "--from",
                "chronus-philly",
                str(bad),
                "--estate",
                str(d),
                "-o",
                str(tmp_path / "x.csv"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"{bad}:2: error[convert]: num_gpu: expected a whole number" in err
    assert not (tmp_path / "x.csv").exists()
    assert (
        main(
            [
                "trace",
                "convert",
                "--from",
                "alibaba-openb",
                str(path),
                "--estate",
                str(d),
                "-o",
                str(tmp_path / "x.csv"),
            ]
        )
        == 2
    )
    assert "missing columns" in capsys.readouterr().err


# ------------------------------------------------------------------------ the public traces


def _excerpt(src: Path, dst: Path, rows: int) -> Path:
    with src.open() as fh:
        lines = [next(fh) for _ in range(rows + 1)]
    dst.write_text("".join(lines))
    return dst


@pytest.mark.shared
@pytest.mark.parametrize(
    "source,file",
    [
        ("chronus-philly", ("traces", "chronus-philly", "trace_job_Philly_MIX1.csv")),
        ("alibaba-openb", ("traces", "alibaba-openb", "openb_pod_list_default.csv")),
    ],
)
def test_public_trace_excerpt_replays_on_the_example_estate(
    tmp_path: Path, source: str, file: tuple[str, ...]
) -> None:
    src = require_shared(*file)
    path = _excerpt(src, tmp_path / "in.csv", 300)
    est = compile_dir(ESTATE).estate
    assert est is not None
    conv = convert(source, str(path), est, seed=5)
    assert len(conv.rows) > 200
    out = tmp_path / "trace.csv"
    out.write_text(conv.csv_text())
    trace = load_trace(str(out), est)  # raises on any bad row
    assert len(trace.tasks) == len(conv.rows)
    report = replay(trace, est).data
    assert report["overall"]["tasks"] == len(conv.rows)
    assert report["overall"]["placed"] > 0
    # deterministic for a seed
    again = convert(source, str(path), est, seed=5)
    assert again.csv_text() == conv.csv_text()
    if source == "alibaba-openb":
        assert convert(source, str(path), est, seed=6).csv_text() != conv.csv_text()
