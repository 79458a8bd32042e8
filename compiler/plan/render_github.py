"""The plan as GitHub Actions workflow commands: each finding lands as an annotation on the
line of the pull request that caused it, and the job log keeps the Plan line."""

from __future__ import annotations

from ..diagnostics import Diagnostic, Position
from . import whatif as wi
from .model import Impact, ObjectChange, Plan
from .render_text import (
    APPROVALS_TITLE,
    ENVELOPE_COLUMNS,
    ENVELOPE_TITLE,
    approval_rows,
    approvers_line,
    attr_text,
    envelope_cells,
    object_title,
)
from .touched import MAX_HUNKS, caused_elsewhere

LEVEL = {"error": "error", "warn": "warning", "info": "notice"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(
    level: str, message: str, pos: Position | None = None, title: str | None = None
) -> str:
    props = []
    if pos is not None:
        props.append(f"file={_prop(pos.file)}")
        if pos.line:
            props.append(f"line={pos.line}")
    if title:
        props.append(f"title={_prop(title)}")
    return (
        f"::{level} {','.join(props)}::{_data(message)}"
        if props
        else f"::{level}::{_data(message)}"
    )


def diagnostic_annotation(d: Diagnostic, base: bool = False) -> str:
    # Base diagnostics point into files of another revision: no file= there, or GitHub
    # would pin them onto lines of the pull request that say something else.
    msg = d.message + (f" (hint: {d.hint})" if d.hint else "")
    if base:
        return annotation(
            "error" if d.is_error else "warning",
            f"base estate: {d.pos}: {msg}" if d.pos else f"base estate: {msg}",
            title=d.code,
        )
    level = "error" if d.is_error else "warning"
    props = []
    if d.pos is not None:
        props.append(f"file={_prop(d.pos.file)}")
        if d.pos.line:
            props.append(f"line={d.pos.line}")
        if d.pos.col:
            props.append(f"col={d.pos.col}")
    props.append(f"title={_prop(d.code)}")
    return f"::{level} {','.join(props)}::{_data(msg)}"


def _impact(i: Impact) -> str:
    return annotation(
        LEVEL[i.severity], i.message, i.pos if i.side == "head" else None, f"klique plan: {i.kind}"
    )


def _change(c: ObjectChange) -> str:
    body = "\n".join(attr_text(a) for a in c.attrs) or object_title(c)
    return annotation("notice", body, c.pos if c.action != "delete" else None, object_title(c))


def caused_annotations(plan: Plan) -> list[str]:
    """The head's errors that show away from the change, repeated on each changed hunk so
    they appear on the pull request's diff."""
    if not plan.base.valid:
        return []
    elsewhere = caused_elsewhere(plan.head.diagnostics, list(plan.touched))
    if not elsewhere:
        return []
    text = "\n".join(
        f"this change causes: {d.message} at {d.pos}"
        if d.pos
        else f"this change causes: {d.message}"
        for d in elsewhere
    )
    return [
        annotation("error", text, Position(h.file, h.first), "klique plan: caused by this change")
        for h in plan.touched[:MAX_HUNKS]
    ]


def review_annotations(plan: Plan) -> list[str]:
    """The approvals and the envelope table as two notices of the job (no file: they are
    about the whole change), so the run's summary says who must review."""
    out = []
    if plan.envelopes:
        rows = [" | ".join(ENVELOPE_COLUMNS)] + [" | ".join(r) for r in envelope_cells(plan)]
        out.append(annotation("notice", "\n".join(rows), title=ENVELOPE_TITLE.rstrip(":")))
    if plan.approvals:
        body = [f"{a}: {who}" for a, who in approval_rows(plan)] + [approvers_line(plan)]
        out.append(annotation("notice", "\n".join(body), title=APPROVALS_TITLE.split(" (")[0]))
    return out


def whatif_annotations(plan: Plan) -> list[str]:
    """The what-if table as a notice of the job, and the demand the head cannot take as a
    warning: work people ran that the change would refuse."""
    w = plan.whatif
    if w is None:
        return []
    rows = [" | ".join(wi.group_header(w))] + [" | ".join(r) for r in wi.group_cells(w)]
    rows += [""] + [" | ".join(wi.pool_header(w))] + [" | ".join(r) for r in wi.pool_cells(w)]
    out = [
        annotation(
            "notice",
            "\n".join([wi.title(w), *rows, *wi.lending_lines(w), *wi.horizon_lines(w)]),
            title="klique plan: what if",
        )
    ]
    refused = wi.refused_lines(w)
    if w.refused_head:
        out.append(
            annotation(
                "warning", "\n".join(refused), title="klique plan: demand the head cannot take"
            )
        )
    elif refused:
        out.append(annotation("notice", "\n".join(refused), title="klique plan: what if"))
    return out


def render_github(plan: Plan) -> str:
    lines = [diagnostic_annotation(d) for d in plan.head.diagnostics]
    lines += caused_annotations(plan)
    if not plan.base.valid:
        lines.append(
            annotation(
                "error",
                f"the base estate ({plan.base.short}) is invalid; fix "
                "it there or pass another --base",
                title="klique plan",
            )
        )
        lines += [diagnostic_annotation(d, base=True) for d in plan.base.diagnostics]
    if plan.valid:
        lines += [_impact(i) for i in plan.impacts]
        lines += [_change(c) for c in plan.changes]
        lines += review_annotations(plan)
        lines += whatif_annotations(plan)
    lines.append(plan.summary_line)
    return "\n".join(lines) + "\n"
