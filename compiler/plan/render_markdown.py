"""The plan as a pull-request comment.

Written for the reviewer who reads the first screen only: the Plan line and what needs
attention come first, the full diff and every impact are folded below. A CI job finds its
own earlier comment by the hidden marker on the first line and updates it in place. GitHub
rejects comments over 65,536 characters, so the comment is cut to ``MAX_CHARS`` with a note
rather than failing to post at all.
"""

from __future__ import annotations

import re

from . import whatif as wi
from .model import Impact, Plan
from .render_text import (
    ENVELOPE_COLUMNS,
    ENVELOPE_TITLE,
    against_line,
    approval_rows,
    caused_line,
    change_lines,
    envelope_cells,
    where,
)

MARKER = "<!-- klique-plan -->"
MAX_CHARS = 60_000
SUMMARY_ROWS = 25
"""Impacts listed in the summary table; the rest are in the folded details."""
MAX_CELL = 400
NOTE_ROOM = 600
BADGE = {"error": "🛑 error", "warn": "⚠️ warn", "info": "ℹ️ info"}
TRUNCATED = (
    "… {n} more lines not shown: the plan is too long for one comment. "
    "Run `kliqued plan` locally, or read the CI job's log."
)


def _cell(text: str) -> str:
    text = text.replace("\r", " ").replace("\n", " ")
    if len(text) > MAX_CELL:
        text = text[: MAX_CELL - 1] + "…"
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|")


def _code(text: str) -> str:
    """Inline code that survives backticks in names or label values."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _fence(body: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", body)), default=2)
    return "`" * max(3, longest + 1)


def _severity_counts(plan: Plan) -> str:
    parts = []
    for sev, word in (("error", "error"), ("warn", "warning"), ("info", "info")):
        n = len(plan.impacts_of(sev))
        if n:
            parts.append(f"{n} {word}{'s' if n != 1 and sev != 'info' else ''}")
    return ", ".join(parts)


def _summary(plan: Plan, max_chars: int) -> list[str]:
    lines = [MARKER, "### Klique plan", ""]
    rev = f"{_code(plan.estate_path + '/')} at {_code(plan.base.short)} → {_code(plan.head.short)}"
    if not plan.valid:
        lines += [f"**{plan.summary_line}** {rev}", ""]
        caused = caused_line(plan)
        if caused:
            lines += [_cell(caused), ""]
        return lines
    lines += [f"**{plan.summary_line}** {rev}", ""]
    against = against_line(plan)
    if against:
        lines += [_cell(against), ""]
    if plan.impacts:
        lines += [
            f"Impact: {_severity_counts(plan)}.",
            "",
            "| Severity | Impact | Where |",
            "|---|---|---|",
        ]
        # The summary is the part that must always be there: it takes a third at most.
        room = max_chars // 3 - sum(len(x) + 1 for x in lines)
        shown = 0
        for i in plan.impacts[:SUMMARY_ROWS]:
            row = _row(i)
            room -= len(row) + 1
            if room < 0:
                break
            lines.append(row)
            shown += 1
        rest = len(plan.impacts) - shown
        if rest > 0:
            lines.append(f"| | … and {rest} more: see *All impacts* below | |")
        lines.append("")
    return lines + _review(plan) + _whatif(plan)


def _review(plan: Plan) -> list[str]:
    """Who must approve, and the departments' envelopes: on the first screen, since that is
    what a department head opens the comment for."""
    lines: list[str] = []
    if plan.approvers:
        who = ", ".join(_code(p.handle) if p.handle else _cell(p.user) for p in plan.approvers)
        lines += [f"**Approvals needed:** {who} (per change below).", ""]
    if plan.envelopes:
        lines += [
            ENVELOPE_TITLE.replace("->", "→"),
            "",
            "| " + " | ".join(ENVELOPE_COLUMNS) + " |",
            "|" + "---|" * len(ENVELOPE_COLUMNS),
        ]
        lines += [
            "| " + " | ".join(_cell(c.replace(" -> ", " → ")) for c in row) + " |"
            for row in envelope_cells(plan)
        ]
        lines.append("")
    return lines


WHATIF_ROWS = 30
"""Groups in the first screen's what-if table (those that change first); all are folded
below."""


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(_cell(c.replace(" -> ", " → ")) for c in r) + " |" for r in rows
    ]


def _first_screen_rows(w: wi.WhatIf) -> list[list[str]]:
    cells = wi.group_cells(w)
    changed = [c for c, r in zip(cells, w.groups) if r.base != r.head or r.name == "all"]
    return changed


def _folded_whatif(w: wi.WhatIf) -> bool:
    """The full table is folded below when the first screen leaves groups out."""
    return len(_first_screen_rows(w)[:WHATIF_ROWS]) < len(w.groups)


def _whatif(plan: Plan) -> list[str]:
    """The comparison on the first screen: the groups whose outcome changes (and ``all``),
    the pools, the demand the head cannot take."""
    w = plan.whatif
    if w is None:
        return []
    changed = _first_screen_rows(w)
    shown = changed[:WHATIF_ROWS]
    lines = ["#### " + _cell(wi.title(w).rstrip(":")), "", "Each cell reads base → head."]
    if len(changed) <= 1:
        lines += ["", "*No group's outcome changes.*"]
    lines += ["", *_md_table(wi.group_header(w), shown)]
    if len(changed) > len(shown):
        lines.append(
            f"| … {len(changed) - len(shown)} more groups change: see *What if: "
            "every group and pool* below |" + " |" * (len(wi.group_header(w)) - 1)
        )
    lines += ["", *_md_table(wi.pool_header(w), wi.pool_cells(w)), ""]
    extra = wi.refused_lines(w, limit=10) + wi.lending_lines(w) + wi.horizon_lines(w)
    for line in extra:
        lines.append(f"- {_cell(line.strip())}" if line.startswith("  ") else f"**{_cell(line)}**")
    return lines + ([""] if extra else [])


def _place(i: Impact) -> str:
    if i.pos is None:
        return ""
    return _cell(where(i.pos)) + (" in the base" if i.side == "base" else "")


def _row(i: Impact) -> str:
    return f"| {BADGE[i.severity]} | {_cell(i.message)} | {_place(i)} |"


def diff_line(line: str) -> str:
    """A change line for a ``diff`` block: GitHub colours a line by its first character, so
    the symbol moves to column 0 (``~`` as ``!``, the diff mark for a changed line)."""
    body = line.lstrip(" ")
    indent = len(line) - len(body)
    if not body or body[0] not in "+-~" or indent == 0:
        return line
    mark = "!" if body[0] == "~" else body[0]
    return mark + " " * indent + body[1:]


def _details(title: str, body: list[str], budget: int, code: str | None = None) -> list[str]:
    """A folded block whose body is cut to fit ``budget`` characters, with a note saying
    how much was left out."""
    fence = _fence("\n".join(body)) if code is not None else ""
    opening = [f"<details><summary>{title}</summary>", ""]
    if code is not None:
        opening.append(fence + code)
    closing = [fence] if code is not None else []
    closing += ["", "</details>", ""]
    fixed = sum(len(x) + 1 for x in opening + closing) + len(TRUNCATED) + 40
    kept: list[str] = []
    used = fixed
    for n, line in enumerate(body):
        if used + len(line) + 1 > budget:
            note = TRUNCATED.format(n=len(body) - n)
            if code is not None:
                kept.append(note)
            else:
                kept += ["", f"*{note}*"]
            break
        kept.append(line)
        used += len(line) + 1
    return opening + kept + closing


def render_markdown(plan: Plan, max_chars: int = MAX_CHARS) -> str:
    out = _summary(plan, max_chars)
    blocks: list[tuple[str, list[str], str | None]] = []
    if not plan.head.valid:
        blocks.append(
            (
                f"The head estate ({_cell(plan.head.short)}) is invalid",
                [d.render() for d in plan.head.diagnostics],
                "text",
            )
        )
    if not plan.base.valid:
        blocks.append(
            (
                f"The base estate ({_cell(plan.base.short)}) is invalid: fix it there "
                "or pass another --base",
                [d.render() for d in plan.base.diagnostics],
                "text",
            )
        )
    if plan.valid:
        if plan.changes:
            body: list[str] = []
            for c in plan.changes:
                if body:
                    body.append("")
                body += [diff_line(x) for x in change_lines(c)]
            blocks.append((f"Changes ({len(plan.changes)})", body, "diff"))
        if plan.impacts:
            blocks.append(
                (
                    f"All impacts ({len(plan.impacts)})",
                    [
                        f"- **{i.severity}** {_cell(i.message)}"
                        + (f" ({_place(i)})" if i.pos else "")
                        for i in plan.impacts
                    ],
                    None,
                )
            )
        if plan.whatif is not None and _folded_whatif(plan.whatif):
            w = plan.whatif
            blocks.append(
                (
                    "What if: every group and pool",
                    _md_table(wi.group_header(w), wi.group_cells(w))
                    + [""]
                    + _md_table(wi.pool_header(w), wi.pool_cells(w)),
                    None,
                )
            )
        if plan.approvals:
            blocks.append(
                (
                    f"Approvals per change ({len(plan.approvals)})",
                    [f"- {_code(a)}: {_cell(who)}" for a, who in approval_rows(plan)],
                    None,
                )
            )
        warnings = [d.render() for d in plan.head.diagnostics if not d.is_error]
        if warnings:
            blocks.append((f"Compiler warnings ({len(warnings)})", warnings, "text"))
    text = "\n".join(out) + "\n"
    needs = [len("\n".join(_details(title, body, 10**9, code))) + 1 for title, body, code in blocks]
    for n, (title, body, code) in enumerate(blocks):
        # Each block still to come is promised an equal share of what is left (or less, if
        # it needs less), so a huge diff cannot push the impacts out of the comment.
        remaining = max_chars - 1 - len(text)
        share = remaining // (len(blocks) - n)
        promised = sum(min(need, share) for need in needs[n + 1 :])
        budget = remaining - max(promised, NOTE_ROOM * (len(blocks) - n - 1))
        if budget < 2 * NOTE_ROOM:
            text += f"*{title}: not shown, the comment is full.*\n"
            continue
        text += "\n".join(_details(title, body, budget, code)) + "\n"
    return text
