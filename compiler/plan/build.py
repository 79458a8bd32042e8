"""From the estate files of two revisions to a Plan: compile both, diff, grade the impacts.

Pure: the files come in as bytes (from git objects or the disk, the caller decides), so a
plan can be made and tested without a repository.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from klique_util.units import SECOND_MS

from ..api import CompileResult, SourceFile, compile_files
from ..compiled import CompiledEstate
from ..source import SourceMap
from .approvals import approvals
from .diff import diff, find_renames, object_pos
from .envelopes import envelope_rows
from .impact import empty_estate, impacts
from .live import LiveState
from .model import Impact, Plan, Revision, Running, is_stale
from .touched import touched
from .whatif import WhatIf


@dataclass(frozen=True)
class Side:
    """One revision's estate as read: ``files`` is None when the estate path is absent."""

    label: str
    commit: str | None
    files: list[SourceFile] | None


def _compile(side: Side) -> tuple[Revision, CompileResult | None]:
    if side.files is None:
        return Revision(side.label, side.commit, None, valid=True, exists=False), None
    result = compile_files(side.files)
    est = result.estate
    return Revision(
        side.label,
        side.commit,
        est.revision if est else None,
        valid=est is not None,
        exists=True,
        diagnostics=tuple(result.diagnostics),
    ), result


WhatIfHook = Callable[[CompiledEstate, CompiledEstate], WhatIf]
"""Replays demand on (base, head): kliqued's, handed in (the compiler may not import it)."""


def make_plan(
    base: Side,
    head: Side,
    estate_path: str,
    now_ms: int | None = None,
    live: LiveState | None = None,
    running: Running | None = None,
    whatif: WhatIfHook | None = None,
) -> Plan:
    """``now_ms``: the plan's time, which decides whether a price change reprices recorded
    usage (default: the live state's time, else the clock: the only thing read here that is
    not an argument). ``live``: the running system's counts (``--against``). ``running``:
    the revision the daemon runs (default: the live state's), to tell a stale base.
    ``whatif``: called with both compiled estates when both compile."""
    if running is None and live is not None:
        running = Running(live.source, live.revision, live.commit)
    if now_ms is None:
        now_ms = live.at_ms if live is not None else int(time.time() * SECOND_MS)
    base_rev, base_res = _compile(base)
    head_rev, head_res = _compile(head)
    hunks = tuple(touched(base.files, head.files))
    if not base_rev.valid or not head_rev.valid:
        return Plan(base_rev, head_rev, estate_path, touched=hunks, live=live, running=running)
    base_est = base_res.estate if base_res else None
    head_est = head_res.estate if head_res else None
    base_src = base_res.sources if base_res else SourceMap()
    head_src = head_res.sources if head_res else SourceMap()
    renames = find_renames(base_est, head_est, head_src)
    changes = diff(base_est, head_est, base_src, head_src, renames)
    found = [
        _locate(i, base_src, head_src) for i in impacts(base_est, head_est, renames, now_ms, live)
    ]
    found += stale_base(base_rev, running)
    found += capacity_notes(head_est, live)
    found.sort(key=Impact.sort_key)
    replayed = None
    if whatif is not None:
        replayed = whatif(base_est or empty_estate(), head_est or empty_estate())
    return Plan(
        base_rev,
        head_rev,
        estate_path,
        tuple(changes),
        tuple(found),
        touched=hunks,
        live=live,
        approvals=approvals(changes, base_est, head_est, base_src, head_src),
        envelopes=envelope_rows(changes, base_est, head_est),
        running=running,
        whatif=replayed,
    )


def stale_base(base: Revision, running: Running | None) -> list[Impact]:
    """A warning when the daemon runs another revision than the base, like a stale
    Terraform plan: the reviewer would read what the change does to an estate that is not
    the one in force."""
    if running is None or not is_stale(base, running):
        return []
    runs = running.revision[:19] + (f" (commit {running.commit[:7]})" if running.commit else "")
    base_text = (
        f"{base.short}, revision {base.estate_revision[:19]}"
        if base.estate_revision
        else f"{base.short}, no estate"
    )
    return [
        Impact(
            "warn",
            "stale-base",
            f"The daemon at {running.source} runs revision {runs}, not the base "
            f"({base_text}): this plan compares the head with an estate that is not "
            "in force. Rebase the change on what runs, or plan with --base set to "
            "the running commit.",
            {
                "running_revision": running.revision,
                "running_commit": running.commit,
                "base_revision": base.estate_revision,
                "source": running.source,
            },
        )
    ]


def capacity_notes(head: CompiledEstate | None, live: LiveState | None) -> list[Impact]:
    """A warning per pool whose live workers disagree with what it declares (issue 15, read
    from the daemon by ``--against``): the plan's numbers are the declared capacity, which
    the machines behind the pool do not have."""
    if live is None:
        return []
    pools = {p.name for p in head.pools} if head is not None else set()
    return [
        Impact(
            "warn",
            "capacity-mismatch",
            f"Pool {pool}: its workers disagree with what it declares ("
            + "; ".join(texts)
            + "). The engine counts the declared capacity: fix "
            "the pool's capacity or nodes, or the machines.",
            {"pool": pool, "mismatches": list(texts)},
            subject=("pool", pool) if pool in pools else None,
        )
        for pool, texts in sorted(live.capacity_mismatches.items())
        if texts
    ]


def _locate(impact: Impact, base_src: SourceMap, head_src: SourceMap) -> Impact:
    """Impacts are computed from compiled estates, which carry no positions; the place is
    looked up afterwards so that CI annotations land on the line that caused them."""
    if impact.subject is None:
        return impact
    kind, name = impact.subject
    pos = object_pos(head_src if impact.side == "head" else base_src, kind, name)
    return replace(impact, pos=pos)
