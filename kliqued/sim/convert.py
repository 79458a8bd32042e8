"""Converting public GPU cluster traces into Klique traces for an estate.

Two sources (../shared/traces/README.md): the Chronus copy of the Microsoft Philly trace (one
row per job; ``user`` is one of 11 virtual clusters) and Alibaba's GPU-sharing trace
``openb_pod_list`` (one row per pod, no user at all, fractional GPUs). Each job becomes one
row ``id,submit,resource,user,project,gpus,runtime`` on the estate's compute resources.

The default mapping (docs/simulation.md):

- The trace's users, sorted, go round-robin to the estate's groups that have a policy, users
  and at least one compute resource, sorted by name. Alibaba has no users: each pod is given
  one of ``openb-user-00`` .. ``openb-user-<N-1>`` (N = the number of those groups) at random
  with a fixed seed, so the same seed gives the same file.
- Within its group, a job goes to the compute resource whose profile fits its GPUs: a
  ``from_task`` profile whose max admits the size (the task then asks for its own size), else
  the fixed profile of exactly that size, else the smallest fixed profile at least as large.
  A fractional size (Alibaba's ``gpu_milli`` below 1000) keeps its fraction only on a
  ``from_task`` profile, else takes the nearest fractional fixed profile. Only profiles with a
  pool large enough for the task count; ties go to the smaller profile, then by name.
- A job of 0 GPUs goes to a 0-GPU profile of the group, else it is dropped (and counted); a
  job larger than the group's limit, or than every profile of the group, is dropped too.
- The estate user is the group's users in turn, job by job; the project is the group's
  first project by name when it lists any (as the daemon's API requires one).
- ``--mapping FILE`` overrides this per trace user: a compute resource, a group, or
  ``{resource|group: ..., user: ...}``.
"""

from __future__ import annotations

import csv
import io
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from compiler.compiled import CompiledEstate
from compiler.diagnostics import Diagnostic, Position, error
from compiler.loader import load_yaml_path
from compiler.units import milli_str
from klique_util.units import MILLI

from kliqued.engine import CRInfo, EstateIndex

SOURCES = ("chronus-philly", "alibaba-openb")
DEFAULT_SEED = 1
ALIBABA_USER = "openb-user-{:02d}"


class ConvertError(Exception):
    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        super().__init__("\n".join(d.render() for d in diagnostics))
        self.diagnostics = diagnostics


@dataclass(slots=True)
class Job:
    id: str
    user: str
    """The trace's user (Philly: a virtual cluster; Alibaba: assigned with the seed)."""
    submit_s: int
    gpus_milli: int
    runtime_s: int


@dataclass(frozen=True)
class Target:
    group: str
    resource: str | None = None
    """Set: every job of the trace user goes to it; None: chosen per job within the group."""
    user: str | None = None
    """Set: every job runs as this user; None: the group's users in turn."""


@dataclass
class Conversion:
    source: str
    jobs_read: int
    rows: list[tuple[str, int, str, str, str, str, int]] = field(default_factory=list)
    """(id, submit s, resource, user, project, gpus text, runtime s), in submit order."""
    targets: dict[str, Target] = field(default_factory=dict)
    per_user: dict[str, Counter] = field(default_factory=dict)
    """Trace user -> compute resource -> tasks written."""
    jobs_per_user: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    """Reason -> jobs dropped."""
    notes: Counter = field(default_factory=Counter)
    """What was adapted but kept, e.g. a size rounded to a profile."""
    skipped: Counter = field(default_factory=Counter)
    """Rows of the source that are not jobs (e.g. a pod never scheduled)."""

    def csv_text(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["id", "submit", "resource", "user", "project", "gpus", "runtime"])
        for r in self.rows:
            w.writerow(r)
        return buf.getvalue()

    def summary(self, out_name: str) -> str:
        what = "pods" if self.source == "alibaba-openb" else "jobs"
        lines = [
            f"read {self.jobs_read:,} {what} ({self.source})"
            + (
                f", skipped {sum(self.skipped.values()):,} that are not jobs"
                if self.skipped
                else ""
            )
        ]
        for reason, n in sorted(self.skipped.items()):
            lines.append(f"  {n:>7,}  {reason}")
        lines.append(f"wrote {len(self.rows):,} tasks to {out_name}")
        lines.append(
            f"{'trace user':<18} {'group':<22} {'jobs':>7} {'tasks':>7}  compute resources"
        )
        for u in sorted(self.jobs_per_user):
            t = self.targets[u]
            crs = self.per_user.get(u, Counter())
            parts = ", ".join(
                f"{r} {n:,}" for r, n in sorted(crs.items(), key=lambda x: (-x[1], x[0]))
            )
            lines.append(
                f"{u:<18} {t.group:<22} {self.jobs_per_user[u]:>7,} "
                f"{sum(crs.values()):>7,}  {parts}"
            )
        dropped = sum(self.dropped.values())
        lines.append(
            f"dropped {dropped:,} job{'s' if dropped != 1 else ''}" + (":" if dropped else "")
        )
        for reason, n in sorted(self.dropped.items(), key=lambda x: (-x[1], x[0])):
            lines.append(f"  {n:>7,}  {reason}")
        for reason, n in sorted(self.notes.items(), key=lambda x: (-x[1], x[0])):
            lines.append(f"note: {n:,} {reason}")
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ reading sources


def _rows(
    path: str, required: tuple[str, ...]
) -> tuple[list[tuple[int, dict[str, str]]], list[Diagnostic]]:
    diags: list[Diagnostic] = []
    try:
        fh = open(path, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise ConvertError(
            [error("convert", f"cannot read: {exc.strerror or exc}", Position(path))]
        ) from None
    out: list[tuple[int, dict[str, str]]] = []
    with fh:
        reader = csv.DictReader(fh)
        names = reader.fieldnames or []
        missing = [c for c in required if c not in names]
        if missing:
            raise ConvertError(
                [
                    error(
                        "convert",
                        f"missing column"
                        f"{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(missing)}: is this the right --from?",
                        Position(path, 1),
                    )
                ]
            )
        for row in reader:
            out.append((reader.line_num, row))
    return out, diags


def _int(path: str, line: int, row: dict[str, str], col: str, diags: list[Diagnostic]) -> int:
    text = (row.get(col) or "").strip()
    try:
        v = int(text)
        if v < 0:
            raise ValueError
        return v
    except ValueError:
        diags.append(
            error(
                "convert",
                f"{col}: expected a whole number >= 0, found {text!r}",
                Position(path, line),
            )
        )
        return 0


def read_philly(path: str) -> tuple[list[Job], Counter]:
    """Jobs of the Chronus-Philly trace, in submit order (ties: file order)."""
    rows, diags = _rows(path, ("job_id", "user", "num_gpu", "submit_time", "duration"))
    jobs: list[Job] = []
    for line, r in rows:
        n = _int(path, line, r, "num_gpu", diags)
        sub = _int(path, line, r, "submit_time", diags)
        dur = _int(path, line, r, "duration", diags)
        jid = (r.get("job_id") or "").strip()
        user = (r.get("user") or "").strip()
        if not jid or not user:
            diags.append(
                error("convert", "job_id and user must not be empty", Position(path, line))
            )
            continue
        jobs.append(Job(jid, user, sub, n * MILLI, dur))
    if diags:
        raise ConvertError(diags[:50])
    jobs.sort(key=lambda j: j.submit_s)  # stable: file order among equal times
    return jobs, Counter()


def read_alibaba(path: str, n_users: int, seed: int) -> tuple[list[Job], Counter]:
    """Pods of the Alibaba openb trace as jobs, in creation order. A pod runs from its
    scheduling to its deletion; a pod never scheduled is not a job (skipped, counted). Each
    pod gets one of ``n_users`` trace users at random, from ``seed``."""
    rows, diags = _rows(
        path, ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")
    )
    rnd = random.Random(seed)
    jobs: list[Job] = []
    skipped: Counter = Counter()
    for line, r in rows:
        # Draw for every row, so a pod's user does not depend on which other pods are kept.
        u = rnd.randrange(max(1, n_users))
        name = (r.get("name") or "").strip()
        if not name:
            diags.append(error("convert", "name must not be empty", Position(path, line)))
            continue
        n = _int(path, line, r, "num_gpu", diags)
        milli = _int(path, line, r, "gpu_milli", diags)
        created = _int(path, line, r, "creation_time", diags)
        deleted = _int(path, line, r, "deletion_time", diags)
        if not (r.get("scheduled_time") or "").strip():
            skipped["pods never scheduled in the trace (no runtime)"] += 1
            continue
        scheduled = _int(path, line, r, "scheduled_time", diags)
        if deleted < scheduled:
            diags.append(
                error(
                    "convert",
                    f"deletion_time {deleted} is before scheduled_time {scheduled}",
                    Position(path, line),
                )
            )
            continue
        size = n * milli  # gpu_milli is per GPU: 1000 for a whole one
        jobs.append(Job(name, ALIBABA_USER.format(u), created, size, deleted - scheduled))
    if diags:
        raise ConvertError(diags[:50])
    jobs.sort(key=lambda j: j.submit_s)
    return jobs, skipped


# ------------------------------------------------------------------------ the mapping


def eligible_groups(index: EstateIndex) -> list[str]:
    """Groups that can take work: a policy, users and at least one compute resource."""
    return sorted(g for g, gi in index.groups.items() if gi.resources and index.users.get(g))


def load_mapping(path: str, index: EstateIndex) -> dict[str, Target]:
    """``users: {<trace user>: <compute resource> | <group> | {resource|group, user}}``."""
    loaded = load_yaml_path(path, "mapping")
    if not loaded.ok:
        raise ConvertError([d for d in loaded.diagnostics if d.is_error])
    root = loaded.root
    diags: list[Diagnostic] = []

    def line_of(node: Any, key: Any) -> int:
        try:
            return node.lc.value(key)[0] + 1
        except Exception:
            return 0

    if not isinstance(root, dict) or not isinstance(root.get("users"), dict):
        raise ConvertError(
            [
                error(
                    "mapping",
                    "expected `users:` mapping each trace user to a "
                    "compute resource, a group, or {resource, user}",
                    Position(path, 1),
                )
            ]
        )
    users = root["users"]
    for k in root:
        if k != "users":
            diags.append(
                error(
                    "mapping",
                    f"unknown key {k!r}",
                    Position(path, line_of(root, k)),
                    "only `users`",
                )
            )
    out: dict[str, Target] = {}
    for tu, v in users.items():
        line = line_of(users, tu)
        pos = Position(path, line)
        resource = group = user = None
        if isinstance(v, str):
            if "/" in v:
                resource = v
            else:
                group = v
        elif isinstance(v, dict):
            unknown = [k for k in v if k not in ("resource", "group", "user")]
            if unknown:
                diags.append(
                    error(
                        "mapping",
                        f"{tu}: unknown field {unknown[0]!r}",
                        pos,
                        "resource, group or user",
                    )
                )
                continue
            resource = str(v["resource"]) if v.get("resource") is not None else None
            group = str(v["group"]) if v.get("group") is not None else None
            user = str(v["user"]) if v.get("user") is not None else None
        else:
            diags.append(
                error(
                    "mapping",
                    f"{tu}: expected a compute resource, a group or {{resource, user}}",
                    pos,
                )
            )
            continue
        if resource is not None:
            cr = index.resources.get(resource)
            if cr is None:
                diags.append(error("mapping", f"{tu}: unknown compute resource {resource!r}", pos))
                continue
            if group is not None and group != cr.group:
                diags.append(
                    error(
                        "mapping",
                        f"{tu}: compute resource {resource} belongs to "
                        f"group {cr.group}, not {group}",
                        pos,
                    )
                )
                continue
            group = cr.group
        if group is None:
            diags.append(error("mapping", f"{tu}: give a compute resource or a group", pos))
            continue
        if group not in index.groups or not index.groups[group].resources:
            diags.append(
                error(
                    "mapping", f"{tu}: group {group!r} has no compute resources in the estate", pos
                )
            )
            continue
        if user is not None and user not in index.users.get(group, frozenset()):
            diags.append(
                error("mapping", f"{tu}: user {user!r} is not in the users of group {group!r}", pos)
            )
            continue
        if user is None and not index.users.get(group):
            diags.append(error("mapping", f"{tu}: group {group!r} has no users; name one", pos))
            continue
        out[str(tu)] = Target(group, resource, user)
    if diags:
        raise ConvertError(diags)
    return out


def assign(
    trace_users: list[str], groups: list[str], explicit: dict[str, Target]
) -> dict[str, Target]:
    """Each trace user's target: the explicit one, else round-robin over ``groups`` in the
    sorted order of the users not mapped explicitly."""
    out: dict[str, Target] = {}
    i = 0
    for u in sorted(trace_users):
        if u in explicit:
            out[u] = explicit[u]
        else:
            out[u] = Target(groups[i % len(groups)])
            i += 1
    return out


class _Chooser:
    """A group's compute resources, by the size of task they fit."""

    def __init__(self, index: EstateIndex, group: str) -> None:
        gi = index.groups[group]
        self.limit = gi.limit
        cap = {p: info.capacity for p, info in index.pools.items()}
        self.from_task: list[tuple[int, str]] = []
        self.fixed: list[tuple[int, str]] = []
        self.room: dict[str, int] = {}
        for name in gi.resources:
            cr: CRInfo = index.resources[name]
            self.room[name] = max((cap.get(p, 0) for p in cr.pools), default=0)
            if cr.fixed_size is None:
                self.from_task.append((cr.max_size or 0, name))
            else:
                self.fixed.append((cr.fixed_size, name))
        self.from_task.sort()
        self.fixed.sort()

    def choose(self, size: int) -> tuple[str, bool] | str:
        """(compute resource, whether the task sets its own size), or why nothing fits."""
        if size == 0:
            for s, name in self.fixed:
                if s == 0:
                    return name, False
            return "0 GPUs and the group has no 0-GPU profile"
        if size > self.limit:
            return "more GPUs than the group's limit"
        for mx, name in self.from_task:
            if size <= mx and size <= self.room[name]:
                return name, True
        if size % 1000:
            fractional = [
                (abs(s - size), -s, name)
                for s, name in self.fixed
                if 0 < s < 1000 and s <= self.room[name]
            ]
            if fractional:
                return min(fractional)[2], False
        for s, name in self.fixed:
            if s == size and s <= self.room[name]:
                return name, False
        for s, name in self.fixed:
            if s > size and s <= self.room[name]:
                return name, False
        return "more GPUs than any profile of the group (or its pools) takes"


def convert(
    source: str,
    path: str,
    estate: CompiledEstate,
    mapping: str | None = None,
    seed: int = DEFAULT_SEED,
) -> Conversion:
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    index = EstateIndex.build(estate)
    groups = eligible_groups(index)
    explicit = load_mapping(mapping, index) if mapping else {}
    if not groups and not explicit:
        raise ConvertError(
            [
                error(
                    "convert",
                    "the estate has no group with a policy, users and "
                    "a compute resource to map the trace to",
                )
            ]
        )
    if source == "chronus-philly":
        jobs, skipped = read_philly(path)
    else:
        jobs, skipped = read_alibaba(path, len(groups) or 1, seed)
    seen: set[str] = set()
    dups = []
    for j in jobs:
        if j.id in seen:
            dups.append(j.id)
        seen.add(j.id)
    if dups:
        raise ConvertError(
            [
                error(
                    "convert",
                    f"job id {dups[0]!r} appears more than once ({len(dups)} duplicates)",
                    Position(path),
                )
            ]
        )
    users = sorted({j.user for j in jobs})
    targets = assign(users, groups, explicit)
    conv = Conversion(source, len(jobs) + sum(skipped.values()), targets=targets, skipped=skipped)
    choosers: dict[str, _Chooser] = {}
    turn: Counter = Counter()
    for j in jobs:
        t = targets[j.user]
        conv.jobs_per_user[j.user] += 1
        if t.resource is not None:
            cr = index.resources[t.resource]
            resource = t.resource
            if cr.fixed_size is None:
                if cr.max_size is not None and j.gpus_milli > cr.max_size:
                    conv.dropped[f"more GPUs than the max of {resource}"] += 1
                    continue
                own = True
            else:
                own = False
                if cr.fixed_size != j.gpus_milli:
                    conv.notes[
                        "jobs took their compute resource's fixed size instead of "
                        "their own (--mapping)"
                    ] += 1
            size = cr.size_for(j.gpus_milli if own else None)
            if size > index.groups[cr.group].limit:
                conv.dropped["more GPUs than the group's limit"] += 1
                continue
        else:
            ch = choosers.get(t.group)
            if ch is None:
                ch = choosers[t.group] = _Chooser(index, t.group)
            got = ch.choose(j.gpus_milli)
            if isinstance(got, str):
                conv.dropped[got] += 1
                continue
            resource, own = got
            cr = index.resources[resource]
            if not own and cr.fixed_size != j.gpus_milli:
                conv.notes["jobs took the nearest profile size instead of their own"] += 1
        group = index.resources[resource].group
        if t.user is not None:
            user = t.user
        else:
            members = sorted(index.users[group])
            user = members[turn[group] % len(members)]
            turn[group] += 1
        projects = sorted(index.projects.get(group, ()))
        conv.rows.append(
            (
                j.id,
                j.submit_s,
                resource,
                user,
                projects[0] if projects else "",
                milli_str(j.gpus_milli) if own else "",
                j.runtime_s,
            )
        )
        conv.per_user.setdefault(j.user, Counter())[resource] += 1
    return conv
