"""A pipeline file: steps, each a task on a compute resource, in a DAG; pure.

The file (YAML) is read with the compiler's loader (positions kept), validated against the
models below (whose JSON Schema is ``schemas/pipeline.schema.json``, generated: ``make
schema``), then checked as a graph: an unknown step in ``needs``, a cycle, a reference to a
parameter not declared or to the outputs of a step that is not an ancestor are each refused
with ``file:line:col``. ``advance`` says what a running pipeline does next from the states of
its steps' tasks: the daemon (kliqued/daemon/state/pipelines.py) applies it.

Values passed between steps: a step's task finds the path of a file in ``KLIQUE_OUTPUTS``
(set by the worker); the ``KEY=VALUE`` lines it writes there come back with its ``finished``
report, and later steps name them as ``${steps.<step>.outputs.<KEY>}`` in their command.
Parameters are ``${params.<name>}``. ``$$`` is a literal ``$``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from compiler.loader import Limits, load_yaml, position_of, to_plain
from klique_util.excerpt import excerpt
from klique_util.units import to_milli

NAME_RE = r"^[a-z0-9]([a-z0-9_-]{0,62}[a-z0-9])?$"
PARAM_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
MAX_STEPS = 200
MAX_FILE_BYTES = 256 * 1024
MAX_NODES = 100_000
"""Values a pipeline file may expand to through aliases: about what 256 KiB written out
holds; the loader allows less to a small file (``compiler.loader.NODES_PER_BYTE``)."""
LIMITS = Limits(
    max_bytes=MAX_FILE_BYTES,
    max_nodes=MAX_NODES,
    too_large_hint="split the pipeline, or move long arguments into a file the steps read",
)
"""The loader's bounds for a pipeline file: the same guard as the estate's, smaller."""
MAX_ERRORS = 20
MAX_ERROR_CHARS = 300
"""A refusal lists at most ``MAX_ERRORS`` problems of at most ``MAX_ERROR_CHARS`` each: a
file with a million wrong values is refused in a few lines, never with the expansion."""


class Step(BaseModel):
    """One step: a task on a compute resource, after the steps it ``needs``."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_RE, description="unique in the pipeline")
    resource: str = Field(
        min_length=1, max_length=512, description="the compute resource, <policy>/<profile>"
    )
    command: list[str] = Field(
        min_length=1,
        max_length=10000,
        description="the task's command; ${params.X} and ${steps.S.outputs.K} are replaced",
    )
    needs: list[str] = Field(
        default_factory=list, max_length=MAX_STEPS, description="steps that must finish first"
    )
    retries: int = Field(default=0, ge=0, le=10, description="times a failed task is sent again")
    project: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="the project this step's use is recorded against (default: the run's "
        "--project, else the pipeline's `project`)",
    )
    gpus: float | None = Field(
        default=None,
        ge=0,
        multiple_of=0.001,
        description="size, for profiles whose size comes from the task",
    )
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def gpus_milli(self) -> int | None:
        """``gpus`` in milli-GPUs, exactly (the model allows 3 decimals at most)."""
        return None if self.gpus is None else to_milli(self.gpus, "gpus")


class PipelineFile(BaseModel):
    """A pipeline (docs/channels.md, "Pipelines")."""

    model_config = ConfigDict(extra="forbid", title="Klique pipeline")
    pipeline: str = Field(pattern=NAME_RE, description="the pipeline's name")
    project: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="the project the steps' use is recorded against, for the steps that "
        "name none (a run's --project comes first)",
    )
    params: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict,
        description="parameters and their defaults (null: must be given at run time)",
    )
    on_failure: Literal["fail-fast", "continue"] = Field(
        default="fail-fast",
        description="fail-fast: a failed step (retries used up) "
        "cancels the running ones and nothing more starts; continue: the steps that do not "
        "need it go on",
    )
    steps: list[Step] = Field(min_length=1, max_length=MAX_STEPS)


def schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **PipelineFile.model_json_schema(mode="validation"),
    }


def schema_text() -> str:
    """``schemas/pipeline.schema.json`` (``make schema``; a test checks it is current)."""
    return json.dumps(schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


class PipelineError(ValueError):
    """A pipeline that cannot run: ``errors`` are ``file:line:col: message`` lines."""

    def __init__(self, errors: list[str], more: int = 0) -> None:
        """``more``: problems found beyond ``errors`` (counted, not worded)."""
        kept = [
            e if len(e) <= MAX_ERROR_CHARS else e[: MAX_ERROR_CHARS - 1] + "…"
            for e in errors[:MAX_ERRORS]
        ]
        if len(errors) + more > MAX_ERRORS:
            kept.append(f"… and {len(errors) + more - MAX_ERRORS} more problems")
        super().__init__("; ".join(kept))
        self.errors = kept


_REF = re.compile(r"\$\$|\$\{([^}]*)\}")
_PARAM = re.compile(r"params\.([A-Za-z_][A-Za-z0-9_]*)")
_OUTPUT = re.compile(r"steps\.([a-z0-9_-]+)\.outputs\.([A-Za-z_][A-Za-z0-9_]*)")


def refs(text: str) -> list[tuple[str, str, str | None]]:
    """The references in one argument: ("param", name, None), ("output", step, key), or
    ("bad", the text inside ${}, None)."""
    out: list[tuple[str, str, str | None]] = []
    for m in _REF.finditer(text):
        inner = m.group(1)
        if inner is None:
            continue  # $$
        if (p := _PARAM.fullmatch(inner)) is not None:
            out.append(("param", p.group(1), None))
        elif (o := _OUTPUT.fullmatch(inner)) is not None:
            out.append(("output", o.group(1), o.group(2)))
        else:
            out.append(("bad", inner, None))
    return out


def substitute(text: str, params: dict[str, str], outputs: dict[str, dict[str, str]]) -> str:
    """``text`` with its references replaced; a missing output is a ``KeyError`` naming it."""

    def one(m: re.Match[str]) -> str:
        inner = m.group(1)
        if inner is None:
            return "$"
        if (p := _PARAM.fullmatch(inner)) is not None:
            return params[p.group(1)]
        o = _OUTPUT.fullmatch(inner)
        assert o is not None  # load() refused anything else
        step, key = o.group(1), o.group(2)
        try:
            return outputs[step][key]
        except KeyError:
            raise KeyError(
                f"step {step} gave no output {key} (it writes KEY=VALUE lines "
                f"to the file named by $KLIQUE_OUTPUTS)"
            ) from None

    return _REF.sub(one, text)


def _text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


@dataclass(frozen=True, eq=False)
class Parsed:
    """A pipeline file read, validated and checked, whatever its run's parameters: what the
    daemon parses once per file and shares among the runs of it (``Loaded.parsed``)."""

    file: str
    text: str
    spec: PipelineFile
    order: list[str]
    """The steps in a topological order (the file's order among those ready together)."""
    param_places: dict[str, str]
    """Where each parameter is declared (``file:line:col``), for a missing value."""


@dataclass(frozen=True)
class Loaded:
    parsed: Parsed
    params: dict[str, str]
    """Every parameter's value for this run (defaults, then what the caller gave)."""
    project: str | None = None
    """The run's project (``kliqued pipeline run --project``), for the steps naming none."""

    @property
    def spec(self) -> PipelineFile:
        return self.parsed.spec

    def project_of(self, step: Step) -> str | None:
        """The project a step's task is recorded against: the step's own, else the run's,
        else the file's (a step is the most specific; a run's flag overrides the file's
        default, as ``--param`` does a parameter's)."""
        return step.project or self.project or self.spec.project

    @property
    def order(self) -> list[str]:
        return self.parsed.order


def load(
    file: str, text: str, given: dict[str, str] | None = None, project: str | None = None
) -> Loaded:
    """Reads, validates and checks a pipeline; ``given``: parameter values for this run,
    ``project``: its project for the steps naming none. A ``PipelineError`` lists the
    problems found (the first ``MAX_ERRORS``), each with its place."""
    return bind(parse(file, text), given, project)


def parse(file: str, text: str) -> Parsed:
    """The part of :func:`load` that reads the file (the costly one), within ``LIMITS``."""
    data = text.encode()
    y = load_yaml(file, data, LIMITS)
    if not y.ok:
        raise PipelineError(
            [
                f"{d.pos or file}: {d.message}" + (f" ({d.hint})" if d.hint else "")
                for d in y.diagnostics
            ]
        )
    root = y.root
    if not isinstance(root, dict):
        raise PipelineError([f"{file}: a pipeline is a mapping with `pipeline` and `steps`"])
    try:
        spec = PipelineFile.model_validate(to_plain(root))
    except ValidationError as exc:
        errs = []
        for e in exc.errors()[: MAX_ERRORS + 1]:  # the rest only counted
            loc = tuple(e["loc"])
            where = position_of(file, root, loc, key=e["type"] == "extra_forbidden")
            errs.append(f"{where}: {'.'.join(str(x) for x in loc) or 'pipeline'}: {e['msg']}")
        raise PipelineError(errs, exc.error_count() - len(errs)) from None
    errors: list[str] = []

    def at(*path: str | int) -> str:
        return str(position_of(file, root, path))

    names: dict[str, int] = {}
    for i, s in enumerate(spec.steps):
        if s.name in names:
            errors.append(
                f"{at('steps', i, 'name')}: step {s.name} is defined twice "
                f"(first as steps[{names[s.name]}])"
            )
        names.setdefault(s.name, i)
    for i, s in enumerate(spec.steps):
        for j, n in enumerate(s.needs):
            if n not in names:
                errors.append(
                    f"{at('steps', i, 'needs', j)}: step {s.name} needs unknown "
                    f"step {excerpt(n, quoted=False)}; the steps are "
                    f"{', '.join(names)}"
                )
            elif n == s.name:
                errors.append(f"{at('steps', i, 'needs', j)}: step {s.name} needs itself")
    if errors:
        raise PipelineError(errors)
    order, cycle = _toposort(spec)
    if cycle:
        first = names[cycle[0]]
        edge = spec.steps[first].needs.index(cycle[1] if len(cycle) > 1 else cycle[0])
        errors.append(
            f"{at('steps', first, 'needs', edge)}: the steps form a cycle "
            f"(A -> B: A needs B): {' -> '.join(cycle + [cycle[0]])}"
        )
        raise PipelineError(errors)
    ancestors = _ancestors(spec)
    for i, s in enumerate(spec.steps):
        for j, arg in enumerate(s.command):
            for kind, a, b in refs(arg):
                place = at("steps", i, "command", j)
                if kind == "bad":
                    errors.append(
                        f"{place}: ${{{excerpt(a, quoted=False)}}} is neither "
                        f"${{params.NAME}} nor "
                        f"${{steps.STEP.outputs.KEY}} (write $$ for a literal $)"
                    )
                elif kind == "param" and a not in spec.params:
                    errors.append(
                        f"{place}: parameter {excerpt(a, quoted=False)} is not declared in `params`"
                    )
                elif kind == "output" and a not in ancestors[s.name]:
                    errors.append(
                        f"{place}: step {s.name} uses the outputs of {a}, which "
                        f"it does not need (add {a} to its `needs`)"
                    )
    if errors:
        raise PipelineError(errors)
    return Parsed(file, text, spec, order, {k: at("params", k) for k in spec.params})


def bind(parsed: Parsed, given: dict[str, str] | None = None, project: str | None = None) -> Loaded:
    """A parsed pipeline with its run's parameters (cheap: no file is read)."""
    spec, file = parsed.spec, parsed.file
    errors: list[str] = []
    params: dict[str, str] = {}
    for k, v in (given or {}).items():
        if k not in spec.params:
            errors.append(
                f"{file}: parameter {excerpt(k, quoted=False)} is given but not "
                f"declared; declared: "
                f"{', '.join(spec.params) or 'none'}"
            )
    for k, default in spec.params.items():
        if given and k in given:
            params[k] = str(given[k])
        elif default is None:
            errors.append(
                f"{parsed.param_places[k]}: parameter {k} has no default: give it "
                f"(--param {k}=VALUE)"
            )
        else:
            params[k] = _text(default)
    if errors:
        raise PipelineError(errors)
    return Loaded(parsed, params, project or None)


def _toposort(spec: PipelineFile) -> tuple[list[str], list[str]]:
    """(the order, []) or ([], a cycle as a list of steps)."""
    needs = {s.name: list(s.needs) for s in spec.steps}
    state: dict[str, int] = {}
    order: list[str] = []
    stack: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        stack.append(n)
        for m in needs[n]:
            if state.get(m) == 1:
                return stack[stack.index(m) :]
            if m not in state:
                c = visit(m)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        order.append(n)
        return []

    for s in spec.steps:
        if s.name not in state:
            c = visit(s.name)
            if c:
                return [], list(reversed(c))
    return order, []


def _ancestors(spec: PipelineFile) -> dict[str, set[str]]:
    needs = {s.name: s.needs for s in spec.steps}
    memo: dict[str, set[str]] = {}

    def of(n: str) -> set[str]:
        if n not in memo:
            memo[n] = set()
            for m in needs[n]:
                memo[n] |= {m} | of(m)
        return memo[n]

    return {n: of(n) for n in needs}


# ---------------------------------------------------------------------- running


WAITING, RUNNING, SUCCEEDED, FAILED, SKIPPED, CANCELLED = (
    "waiting",
    "running",
    "succeeded",
    "failed",
    "skipped",
    "cancelled",
)


@dataclass
class StepRun:
    """A step of a running pipeline: its attempts' tasks and how it stands."""

    name: str
    tasks: list[str] = field(default_factory=list)
    state: str = WAITING
    text: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Submit:
    """Send a step's next attempt (its references replaced)."""

    step: str
    attempt: int
    command: list[str]


@dataclass(frozen=True)
class Mark:
    """A step's new state, without a task: succeeded or failed (its task ended), failed (an
    output it uses is missing), skipped or cancelled."""

    step: str
    state: str
    text: str
    outputs: dict[str, str] | None = None


@dataclass(frozen=True)
class Finish:
    state: str
    text: str


@dataclass(frozen=True)
class TaskEnd:
    """How a step's task ended: ``finished`` or not, why, and its outputs."""

    ok: bool
    text: str
    outputs: dict[str, str] | None = None


Action = Submit | Mark | Finish


def advance(
    spec: PipelineFile, params: dict[str, str], steps: dict[str, StepRun], ended: dict[str, TaskEnd]
) -> tuple[list[Action], list[str]]:
    """What a running pipeline does next, given how its steps' tasks ended (``ended``, by
    task id; a task not in it still runs): the actions in order (each step's new state, the
    attempts to submit, the pipeline's end) and the tasks to cancel (fail-fast). ``steps`` is
    not changed: the daemon records the actions as events, whose reducers change it, so a
    replay rebuilds the same pipeline."""
    cur = {
        n: StepRun(r.name, list(r.tasks), r.state, r.text, dict(r.outputs))
        for n, r in steps.items()
    }
    actions: list[Action] = []

    def mark(name: str, state: str, text: str, outputs: dict[str, str] | None = None) -> None:
        cur[name].state, cur[name].text = state, text
        cur[name].outputs = dict(outputs or {})
        actions.append(Mark(name, state, text, outputs))

    by_name = {s.name: s for s in spec.steps}
    failed_now: list[str] = []
    for s in spec.steps:
        run = cur[s.name]
        if run.state != RUNNING or not run.tasks:
            continue
        end = ended.get(run.tasks[-1])
        if end is None:
            continue
        if end.ok:
            mark(s.name, SUCCEEDED, end.text, end.outputs)
        elif len(run.tasks) <= s.retries and not end.text.startswith("cancelled"):
            actions.append(Submit(s.name, len(run.tasks) + 1, _command(s, params, cur)))
        else:
            tries = f" (after {len(run.tasks)} attempts)" if len(run.tasks) > 1 else ""
            mark(s.name, FAILED, f"{end.text}{tries}")
            failed_now.append(s.name)
    cancel: list[str] = []
    failed = failed_now or [r.name for r in cur.values() if r.state == FAILED]
    if failed and spec.on_failure == "fail-fast":
        first = failed[0]
        cancel = [
            r.tasks[-1]
            for r in cur.values()
            if r.state == RUNNING and r.tasks and r.tasks[-1] not in ended
        ]
        for r in list(cur.values()):
            if r.state in (WAITING, RUNNING):
                mark(r.name, CANCELLED, f"not run: step {first} failed (fail-fast)")
        return actions + [Finish(FAILED, f"step {first} failed: {cur[first].text}")], cancel
    progress = True
    while progress:  # a step failed without a task may skip its dependents at once
        progress = False
        for name in _toposort(spec)[0]:
            run = cur[name]
            if run.state != WAITING:
                continue
            needs = [cur[n] for n in by_name[name].needs]
            bad = [n for n in needs if n.state in (FAILED, SKIPPED, CANCELLED)]
            if bad:
                mark(name, SKIPPED, f"skipped: needs {bad[0].name}, which {bad[0].state}")
                progress = True
            elif all(n.state == SUCCEEDED for n in needs):
                try:
                    cmd = _command(by_name[name], params, cur)
                except KeyError as exc:
                    mark(name, FAILED, str(exc.args[0]))
                    if spec.on_failure == "fail-fast":  # nothing more is sent
                        sub, cancel = advance(spec, params, cur, ended)
                        kept = [a for a in actions if not isinstance(a, Submit)]
                        return kept + sub, cancel
                    progress = True
                    continue
                actions.append(Submit(name, 1, cmd))
                run.state = RUNNING  # in this copy only: no second submission below
    if not any(isinstance(a, Submit) for a in actions) and all(
        r.state not in (WAITING, RUNNING) for r in cur.values()
    ):
        bad_steps = [r.name for r in cur.values() if r.state != SUCCEEDED]
        if bad_steps:
            actions.append(Finish(FAILED, f"steps not succeeded: {', '.join(bad_steps)}"))
        else:
            actions.append(Finish(SUCCEEDED, f"{len(cur)} steps succeeded"))
    return actions, cancel


def _command(step: Step, params: dict[str, str], steps: dict[str, StepRun]) -> list[str]:
    outputs = {n: r.outputs for n, r in steps.items() if r.state == SUCCEEDED}
    return [substitute(a, params, outputs) for a in step.command]
