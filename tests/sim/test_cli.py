"""``kliqued simulate``: exit codes and what it prints."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from kliqued.commands import simulate

GOOD = """
name: t
estate:
  pools: [{name: p, kind: baremetal, capacity: 2, gpu_type: h100}]
  profiles: [{name: gpu1, gpus: 1, pools: [p], policies: [a]}]
  policies: [{name: a, group: a, reservation: 0, limit: 2}]
  groups: [{name: a, users: [alice], projects: [x]}]
events:
  - at: 0s
    submit: {resource: a/gpu1, user: alice, id: t, count: 3, project: x}
expect:
  - at: 1s
    running: {a: %s}
    waiting_reason: {t-3: limit}
"""


def _run(tmp_path: Path, text: str, *extra: str) -> tuple[int, str]:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    simulate.register(sub)
    args = parser.parse_args(["simulate", *extra, str(f)])
    out = io.StringIO()
    return args.handler(args, out=out), out.getvalue()


def test_ok(tmp_path: Path) -> None:
    code, out = _run(tmp_path, GOOD % 2)
    assert code == 0, out


def test_miss_lists_time_key_expected_found(tmp_path: Path) -> None:
    code, out = _run(tmp_path, GOOD % 3)
    assert code == 1
    assert "running.a: expected 3, found 2" in out and "+1s" in out


def test_timeline(tmp_path: Path) -> None:
    code, out = _run(tmp_path, GOOD % 2, "--timeline")
    assert code == 0
    assert "place    t-1 on p" in out and "waits    t-3: limit: group at limit (2/2 GPUs)" in out


def test_invalid_with_file_and_line(tmp_path: Path) -> None:
    bad = (
        GOOD % 2
        + """  - at: 2s
    running: {nobody: 1}
"""
    )
    bad = bad.replace("user: alice, id: t", "user: mallory, id: t")
    bad = bad.replace(
        "resource: a/gpu1, user: mallory, id: t, count: 3, project: x}",
        "resource: a/gpu1, user: mallory, id: t, count: 3, project: x}\n"
        "  - at: 0s\n    submit: {resource: a/gpu1, user: alice, id: u, gpus: 2, "
        "project: x}\n"
        "  - at: 0s\n    submit: {resource: a/nope, user: alice, id: v}\n"
        "  - at: 0s\n    submit: {resource: a/gpu1, user: alice, id: w, project: y}",
    )
    code, out = _run(tmp_path, bad)
    assert code == 2
    assert "s.yaml:10: error[scenario]: submit: user 'mallory'" in out
    assert "fixed size" in out and "unknown compute resource 'a/nope'" in out
    assert "project 'y'" in out and "unknown group 'nobody'" in out
    assert "not run" in out


def test_events_out_of_order_and_bad_time(tmp_path: Path) -> None:
    text = (GOOD % 2).replace(
        "events:\n", "events:\n  - at: 1h\n    finish: []\n  - at: 5q\n    finish: []\n"
    )
    code, out = _run(tmp_path, text)
    assert code == 2
    assert "events out of time order" in out and "unparsable time '5q'" in out


def test_set_that_breaks_the_estate_shows_compile_errors(tmp_path: Path) -> None:
    text = (GOOD % 2).replace(
        "expect:", "  - at: 1h\n    set: {policies.a.reservation: 5}\nexpect:"
    )
    code, out = _run(tmp_path, text)
    assert code == 2
    assert "this set makes the estate invalid" in out and "reservation" in out


def test_bad_workers_events_and_started_expectations_name_their_line(tmp_path: Path) -> None:
    text = (GOOD % 2).replace(
        "events:\n",
        "events:\n  - at: 0s\n    workers: {nope: 1}\n"
        "  - at: 0s\n    workers: {p: -1}\n"
        "  - at: 0s\n    workers: []\n",
    )
    text += "    started: {t-1: yes}\n    preempted: {t-2: unstarted}\n"
    code, out = _run(tmp_path, text)
    assert code == 2, out
    assert "s.yaml:10: error[scenario]: workers: unknown pool 'nope'" in out
    assert "s.yaml:12: error[scenario]: workers: " in out and "p" in out
    assert "workers: expected a mapping of <pool>: <GPUs of its live workers>" in out
    assert "started.t-1: expected true or false, found 'yes'" in out
    assert "preempted.t-2" not in out  # unstarted is a preemption kind


def test_a_pool_with_no_live_worker_in_the_timeline(tmp_path: Path) -> None:
    text = (GOOD % 0).replace("events:\n", "events:\n  - at: 0s\n    workers: {p: 0}\n")
    text = text.replace("waiting_reason: {t-3: limit}", "waiting_reason: {t-1: capacity}")
    code, out = _run(tmp_path, text, "--timeline")
    assert code == 0, out
    assert "workers  p: none live" in out
    assert "waits    t-1: capacity: no live worker in p" in out


def test_a_refused_submit_points_at_the_field_at_fault(tmp_path: Path) -> None:
    """The line is the refused field's, from SubmissionError.field: a project named
    ``user-study`` is the project's fault, not the user's."""
    text = (GOOD % 2).replace(
        "count: 3, project: x}", "count: 3,\n              project: user-study}"
    )
    code, out = _run(tmp_path, text)
    assert code == 2, out
    assert "s.yaml:11: error[scenario]: submit: project 'user-study'" in out, out
