"""The plan for a terminal, in the shape ``terraform plan`` taught everyone to read.

Also the body of the markdown rendering's ``diff`` block (without colour), so a reviewer
sees the same lines in a terminal and in the pull request.
"""

from __future__ import annotations

from ..diagnostics import Diagnostic, Position, render_all
from ..units import milli_str
from . import whatif as wi
from .model import AttrChange, EnvelopeFigures, Impact, ObjectChange, Plan
from .touched import caused_elsewhere

GREEN, RED, YELLOW, CYAN, BOLD, DIM, RESET = (
    "\033[32m",
    "\033[31m",
    "\033[33m",
    "\033[36m",
    "\033[1m",
    "\033[2m",
    "\033[0m",
)
OP_COLOUR = {"+": GREEN, "-": RED, "~": YELLOW}
SEVERITY_COLOUR = {"error": RED + BOLD, "warn": YELLOW, "info": CYAN}
MAX_ALIGN = 56
"""Attribute lines are padded to align their places, up to this width: a long list value
must not push every place of the object off the screen."""


def where(pos: Position | None) -> str:
    if pos is None:
        return ""
    return f"{pos.file}:{pos.line}" if pos.line else pos.file


def _paint(text: str, colour: str, on: bool) -> str:
    return f"{colour}{text}{RESET}" if on and colour else text


def attr_text(a: AttrChange) -> str:
    if a.op == "~":
        return f"{a.op} {a.name} = {a.before} -> {a.after}"
    return f"{a.op} {a.name} = {a.after if a.op == '+' else a.before}"


def object_title(c: ObjectChange) -> str:
    if c.kind in ("settings", "estate"):
        return f"{c.symbol} {c.kind}"
    if c.action == "rename":
        return f'{c.symbol} {c.kind} "{c.old_name}" → "{c.name}"'
    return f'{c.symbol} {c.kind} "{c.name}"'


def change_lines(c: ObjectChange, colour: bool = False) -> list[str]:
    """One object: its title with its place, then one line per attribute. A removed object
    cites only its old place: its attributes' old lines would point into files that the
    reviewer no longer sees."""
    title = object_title(c)
    head = f"  {_paint(title, OP_COLOUR[c.symbol], colour)}"
    if c.pos is not None:
        head += f"  ({where(c.pos)})"
    lines = [head]
    texts = [attr_text(a) for a in c.attrs]
    width = min(max((len(t) for t in texts), default=0), MAX_ALIGN)
    for a, t in zip(c.attrs, texts):
        line = "      " + _paint(t, OP_COLOUR[a.op], colour)
        if c.action != "delete" and a.pos is not None:
            line += " " * max(width - len(t) + 2, 2) + _paint(f"({where(a.pos)})", DIM, colour)
        lines.append(line)
    return lines


def impact_line(i: Impact, colour: bool = False) -> str:
    label = _paint(f"{i.severity:<5}", SEVERITY_COLOUR[i.severity], colour)
    text = f"  {label}  {i.message}"
    if i.pos is not None:
        text += f"  ({where(i.pos)}{' in the base' if i.side == 'base' else ''})"
    return text


def caused_line(plan: Plan) -> str | None:
    """Where the change is, when its errors show elsewhere: the reader of an invalid plan
    looks for the line to fix, which is often not the line the error is reported at."""
    if not plan.base.valid or not plan.touched:
        return None
    n = len(caused_elsewhere(plan.head.diagnostics, list(plan.touched)))
    if not n:
        return None
    places = ", ".join(f"{h.file}:{h.first}" for h in plan.touched[:5])
    more = f" and {len(plan.touched) - 5} more" if len(plan.touched) > 5 else ""
    return (
        f"{'This error shows' if n == 1 else 'These errors show'} away from the lines "
        f"the change touched ({places}{more}); the change causes "
        f"{'it' if n == 1 else 'them'}."
    )


APPROVALS_TITLE = (
    "Approvals needed (admins of the groups each change touches and of the "
    "groups above them; IT for shared objects):"
)
NO_APPROVER = "nobody named: set settings.approvers or admins on a top group"
ENVELOPE_TITLE = "Departments' envelopes the change touches (before -> after):"
ENVELOPE_COLUMNS = (
    "envelope",
    "reserved",
    "shared",
    "team limits",
    "limit",
    "budget",
    "over-subscription",
)


def approval_rows(plan: Plan) -> list[tuple[str, str]]:
    """(change address, its approvers as text), in the order of the changes."""
    return [
        (a.address, ", ".join(p.text for p in a.approvers) or NO_APPROVER) for a in plan.approvals
    ]


def approvers_line(plan: Plan) -> str:
    who = plan.approvers
    return (
        "All approvers: "
        + (
            ", ".join(f"{p.user} {p.handle}" if p.handle else p.user for p in who)
            if who
            else "none named"
        )
        + "."
    )


def _budget(f: EnvelopeFigures) -> str:
    if f.budget_hours_milli is None:
        return "none"
    return f"{milli_str(f.budget_hours_milli)} h/{f.budget_period}"


def _ratio(f: EnvelopeFigures) -> str:
    r = f.oversubscription
    return "-" if r is None else f"{r:.2f}x"


ENVELOPE_FIELDS = (
    lambda f: milli_str(f.reservation_milli),
    lambda f: milli_str(f.shared_milli),
    lambda f: milli_str(f.team_limits_milli),
    lambda f: milli_str(f.limit_milli),
    _budget,
    _ratio,
)
"""The figures of one envelope as text, in the order of ``ENVELOPE_COLUMNS[1:]``."""


def envelope_cells(plan: Plan) -> list[list[str]]:
    """One row of cells per envelope: ``a -> b`` where the change moves a figure, the value
    alone where it does not, ``-`` on a side where the policy is no envelope."""
    rows = []
    for row in plan.envelopes:
        cells = [row.name]
        for field in ENVELOPE_FIELDS:
            before = field(row.before) if row.before else "-"
            after = field(row.after) if row.after else "-"
            cells.append(after if before == after else f"{before} -> {after}")
        rows.append(cells)
    return rows


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def review_lines(plan: Plan) -> list[str]:
    """The approvals and the envelope table, for the terminal and the markdown diff."""
    lines: list[str] = []
    if plan.envelopes:
        lines += [ENVELOPE_TITLE, *_table([list(ENVELOPE_COLUMNS), *envelope_cells(plan)]), ""]
    if plan.approvals:
        lines.append(APPROVALS_TITLE)
        rows = approval_rows(plan)
        width = min(max(len(a) for a, _ in rows), MAX_ALIGN)
        lines += [f"  {a.ljust(width)}  {who}" for a, who in rows]
        lines += [approvers_line(plan), ""]
    return lines


def whatif_lines(plan: Plan) -> list[str]:
    """The what-if comparison: per group, then per pool, each cell ``base -> head``."""
    w = plan.whatif
    if w is None:
        return []
    lines = [
        wi.title(w),
        "",
        *_table([wi.group_header(w), *wi.group_cells(w)]),
        "",
        *_table([wi.pool_header(w), *wi.pool_cells(w)]),
        "",
    ]
    extra = wi.refused_lines(w) + wi.lending_lines(w) + wi.horizon_lines(w)
    return lines + (extra + [""] if extra else [])


def header(plan: Plan) -> str:
    return f"kliqued plan: {plan.estate_path or '.'}/ at {plan.base.short} -> {plan.head.short}"


def against_line(plan: Plan) -> str | None:
    """Where the live counts come from, and a word when the daemon does not run the base:
    the counts are then of what runs, which is what the change will meet."""
    live = plan.live
    if live is None:
        return None
    text = f"Counted against {live.source}: revision {live.revision[:19]} at {live.at}"
    if plan.base.estate_revision is not None and live.revision != plan.base.estate_revision:
        text += " (the daemon does not run the base revision: the counts are of what it runs)"
    return text


def _diagnostic_block(title: str, diags: tuple[Diagnostic, ...]) -> list[str]:
    return [title, *("  " + line for line in render_all(list(diags)).splitlines())]


def render_text(plan: Plan, colour: bool = False) -> str:
    lines = [header(plan), ""]
    against = against_line(plan)
    if against:
        lines += [against, ""]
    if not plan.head.valid:
        lines += _diagnostic_block(
            f"The head estate ({plan.head.short}) is invalid:", plan.head.diagnostics
        )
        lines.append("")
        caused = caused_line(plan)
        if caused:
            lines += [caused, ""]
    if not plan.base.valid:
        lines += _diagnostic_block(
            f"The base estate ({plan.base.short}) is invalid; fix it there or pass another --base:",
            plan.base.diagnostics,
        )
        lines.append("")
    if not plan.valid:
        lines.append(_paint(plan.summary_line, RED + BOLD, colour))
        return "\n".join(lines) + "\n"
    warnings = tuple(d for d in plan.head.diagnostics if not d.is_error)
    if warnings:
        lines += _diagnostic_block("Warnings in the head estate:", warnings)
        lines.append("")
    for note in _notes(plan):
        lines += [note, ""]
    if not plan.changes:
        if plan.impacts:
            lines += ["Impact:", *(impact_line(i, colour) for i in plan.impacts), ""]
        lines += whatif_lines(plan)
        lines.append(
            _paint("No changes.", BOLD, colour)
            + " The head estate compiles to the same objects as the base."
        )
        return "\n".join(lines) + "\n"
    lines.append("Changes (+ add, - remove, ~ change):")
    lines.append("")
    for c in plan.changes:
        lines += change_lines(c, colour)
        lines.append("")
    if plan.impacts:
        lines.append("Impact:")
        lines += [impact_line(i, colour) for i in plan.impacts]
        lines.append("")
    lines += review_lines(plan)
    lines += whatif_lines(plan)
    lines.append(_paint(plan.summary_line, BOLD, colour))
    return "\n".join(lines) + "\n"


def _notes(plan: Plan) -> list[str]:
    notes = []
    if not plan.base.exists:
        notes.append(
            f"{plan.estate_path}/ does not exist at {plan.base.short}: everything is added."
        )
    if not plan.head.exists:
        notes.append(
            f"{plan.estate_path}/ does not exist at {plan.head.short}: everything is removed."
        )
    return notes
