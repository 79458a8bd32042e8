"""The checks of a profile's session idle limits (``idle:``, docs/estate.md): a limit of 0
would stop every session the moment it starts, and a cpu/gpu/network limit at or above
``wall`` can never be reached (the wall limit stops the session first)."""

from __future__ import annotations

from .diagnostics import Diagnostic, error, warning
from .models import Profile
from .source import SourceObject
from .units import duration_str

KINDS = ("wall", "cpu", "gpu", "network")


def check_profile_idle(obj: SourceObject[Profile], prof: Profile) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    idle = prof.idle
    if idle is None:
        return diags
    for kind in KINDS:
        if getattr(idle, kind) == 0:
            diags.append(
                error(
                    "idle-limit",
                    f"{obj.label}: idle.{kind} is 0, which would "
                    "stop every session as soon as it starts",
                    obj.pos("idle", kind),
                    f"give a duration such as 30m, or leave idle.{kind} out for no limit",
                )
            )
    wall = idle.wall
    if wall:
        for kind in KINDS[1:]:
            value = getattr(idle, kind)
            if value and value >= wall:
                diags.append(
                    warning(
                        "idle-limit-unreachable",
                        f"{obj.label}: idle.{kind} ({duration_str(value)}) is not shorter than "
                        f"idle.wall ({duration_str(wall)}): the wall limit stops a session first",
                        obj.pos("idle", kind),
                        f"lower idle.{kind} below {duration_str(wall)} or leave it out",
                    )
                )
    return diags
