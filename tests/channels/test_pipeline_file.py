"""A pipeline file read and checked (kliqued/schedule/pipeline.py), and what a running one
does next (``advance``), pure: each bad file is refused with the place of the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kliqued.schedule import pipeline as P

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
pipeline: nightly
params:
  dataset: imagenet
  epochs: 3
steps:
  - name: prepare
    resource: team-a/one
    command: [python, prep.py, "${params.dataset}"]
  - name: train
    resource: team-a/one
    needs: [prepare]
    retries: 2
    command: [python, train.py, "${steps.prepare.outputs.path}", "${params.epochs}"]
  - name: report
    resource: team-a/one
    needs: [train]
    command: [echo, "cost: $$5"]
"""


def errors(text: str, params: dict | None = None) -> list[str]:
    with pytest.raises(P.PipelineError) as exc:
        P.load("p.yaml", text, params)
    return exc.value.errors


def test_a_good_file_loads_with_its_order_and_params() -> None:
    loaded = P.load("p.yaml", GOOD, {"epochs": "5"})
    assert loaded.order == ["prepare", "train", "report"]
    assert loaded.params == {"dataset": "imagenet", "epochs": "5"}


def test_a_cycle_is_refused_at_its_place() -> None:
    text = GOOD.replace("    needs: [prepare]\n", "    needs: [prepare, report]\n")
    errs = errors(text)
    assert len(errs) == 1
    assert errs == [
        "p.yaml:16:13: the steps form a cycle (A -> B: A needs B): report -> train -> report"
    ]


def test_an_unknown_step_is_refused_at_its_place() -> None:
    errs = errors(GOOD.replace("needs: [train]", "needs: [trian]"))
    assert errs == [
        "p.yaml:16:13: step report needs unknown step trian; the steps are prepare, train, report"
    ]


def test_a_field_the_schema_does_not_know_is_refused_at_its_name() -> None:
    errs = errors(GOOD.replace("    retries: 2\n", "    retry: 2\n"))
    assert errs[0].startswith("p.yaml:12:5: steps.1.retry: Extra inputs"), errs


def test_references_are_checked() -> None:
    errs = errors(GOOD.replace("${params.epochs}", "${params.epoch}"))
    assert "parameter epoch is not declared" in errs[0] and errs[0].startswith("p.yaml:13:")
    errs = errors(
        GOOD.replace(
            'command: [echo, "cost: $$5"]', 'command: [echo, "${steps.prepare.outputs.path}x"]'
        ).replace("needs: [train]", "needs: []")
    )
    assert "uses the outputs of prepare, which it does not need" in errs[0]
    errs = errors(GOOD.replace("$$5", "${HOME}"))
    assert "${HOME} is neither" in errs[0]


def test_params_given_are_declared_and_required_ones_given() -> None:
    assert "parameter nope is given but not declared" in errors(GOOD, {"nope": "1"})[0]
    text = GOOD.replace("  dataset: imagenet", "  dataset: null")
    assert "parameter dataset has no default" in errors(text)[0]


def test_malformed_yaml_is_a_positioned_error() -> None:
    assert errors("pipeline: x\nsteps: [\n")[0].startswith("p.yaml:")


def test_the_schema_file_is_generated_from_the_models() -> None:
    on_disk = json.loads((REPO / "schemas" / "pipeline.schema.json").read_text())
    assert on_disk == P.schema(), "schemas/pipeline.schema.json is stale: run `make schema`"


def steps_of(spec: P.PipelineFile) -> dict[str, P.StepRun]:
    return {s.name: P.StepRun(s.name) for s in spec.steps}


def test_advance_sends_roots_then_dependents_with_outputs() -> None:
    loaded = P.load("p.yaml", GOOD)
    steps = steps_of(loaded.spec)
    actions, cancel = P.advance(loaded.spec, loaded.params, steps, {})
    assert actions == [P.Submit("prepare", 1, ["python", "prep.py", "imagenet"])]
    steps["prepare"].state, steps["prepare"].tasks = P.RUNNING, ["t1"]
    assert P.advance(loaded.spec, loaded.params, steps, {}) == ([], [])
    ended = {"t1": P.TaskEnd(True, "finished", {"path": "/data/x"})}
    actions, _ = P.advance(loaded.spec, loaded.params, steps, ended)
    assert actions == [
        P.Mark("prepare", P.SUCCEEDED, "finished", {"path": "/data/x"}),
        P.Submit("train", 1, ["python", "train.py", "/data/x", "3"]),
    ]


def test_advance_retries_then_fails_fast() -> None:
    loaded = P.load("p.yaml", GOOD)
    steps = steps_of(loaded.spec)
    steps["prepare"] = P.StepRun("prepare", ["t1"], P.SUCCEEDED, outputs={"path": "/d"})
    steps["train"] = P.StepRun("train", ["t2"], P.RUNNING)
    failed = {"t2": P.TaskEnd(False, "failed: exit code 1")}
    actions, _ = P.advance(loaded.spec, loaded.params, steps, failed)
    assert actions == [P.Submit("train", 2, ["python", "train.py", "/d", "3"])]
    steps["train"].tasks = ["t2", "t3", "t4"]
    actions, _ = P.advance(
        loaded.spec, loaded.params, steps, {"t4": P.TaskEnd(False, "failed: exit code 1")}
    )
    assert actions[0] == P.Mark("train", P.FAILED, "failed: exit code 1 (after 3 attempts)")
    assert P.Mark("report", P.CANCELLED, "not run: step train failed (fail-fast)") in actions
    assert actions[-1] == P.Finish(
        P.FAILED, "step train failed: failed: exit code 1 (after 3 attempts)"
    )


def test_continue_skips_only_the_dependents() -> None:
    text = (
        GOOD.replace("steps:\n", "on_failure: continue\nsteps:\n")
        + """\
  - name: other
    resource: team-a/one
    command: ["true"]
"""
    )
    loaded = P.load("p.yaml", text)
    steps = steps_of(loaded.spec)
    steps["prepare"] = P.StepRun("prepare", ["t1"], P.RUNNING)
    steps["other"] = P.StepRun("other", ["t2"], P.RUNNING)
    actions, cancel = P.advance(
        loaded.spec, loaded.params, steps, {"t1": P.TaskEnd(False, "failed: exit code 2")}
    )
    assert cancel == []
    assert actions == [
        P.Mark("prepare", P.FAILED, "failed: exit code 2"),
        P.Mark("train", P.SKIPPED, "skipped: needs prepare, which failed"),
        P.Mark("report", P.SKIPPED, "skipped: needs train, which skipped"),
    ]
    steps.update(
        {
            n: P.StepRun(n, [], s)
            for n, s in (("prepare", P.FAILED), ("train", P.SKIPPED), ("report", P.SKIPPED))
        }
    )
    steps["other"] = P.StepRun("other", ["t2"], P.RUNNING)
    actions, _ = P.advance(loaded.spec, loaded.params, steps, {"t2": P.TaskEnd(True, "ok")})
    assert actions[-1] == P.Finish(P.FAILED, "steps not succeeded: prepare, train, report")


def test_a_missing_output_fails_the_step_without_a_task() -> None:
    loaded = P.load("p.yaml", GOOD)
    steps = steps_of(loaded.spec)
    steps["prepare"] = P.StepRun("prepare", ["t1"], P.RUNNING)
    actions, _ = P.advance(
        loaded.spec, loaded.params, steps, {"t1": P.TaskEnd(True, "finished", {})}
    )
    assert not any(isinstance(a, P.Submit) for a in actions)
    assert (
        P.Mark(
            "train",
            P.FAILED,
            "step prepare gave no output path (it writes KEY=VALUE "
            "lines to the file named by $KLIQUE_OUTPUTS)",
        )
        in actions
    )
    assert isinstance(actions[-1], P.Finish) and actions[-1].state == P.FAILED


def test_a_step_takes_its_own_project_else_the_runs_else_the_files() -> None:
    text = GOOD.replace("pipeline: nightly\n", "pipeline: nightly\nproject: evals\n").replace(
        "    needs: [train]\n", "    needs: [train]\n    project: rlhf\n"
    )
    by = {s.name: s for s in P.load("p.yaml", text).spec.steps}
    file_only = P.load("p.yaml", text)
    assert [file_only.project_of(by[n]) for n in ("prepare", "report")] == ["evals", "rlhf"]
    run = P.load("p.yaml", text, project="foundation-7b")
    assert [run.project_of(by[n]) for n in ("prepare", "report")] == ["foundation-7b", "rlhf"]
    assert P.load("p.yaml", GOOD).project_of(by["prepare"]) is None
