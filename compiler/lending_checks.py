"""The checks of lending.md's fields: ``lend_weight`` above 0, ``protect_for`` only on a
team's policy (protection belongs to the work's own group), and a warning for a
``lend_weight`` that has no effect because ``settings.lending.order`` is not ``fair``.

Apart from ``org_checks`` because they read the settings as well as the tree; each finding
has the position of the field at fault and a hint, like every other check.
"""

from __future__ import annotations

from .diagnostics import Diagnostic, error, warning
from .hierarchy import Organisation
from .models import Policy, Settings
from .source import SourceObject


def check_lending(
    org: Organisation,
    policies: dict[str, SourceObject[Policy]],
    settings: SourceObject[Settings] | None,
) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    model: Settings | None = settings.model if settings is not None else None
    order = model.lending.order if model is not None and model.lending is not None else "ordered"
    for name, obj in policies.items():
        pol: Policy = obj.model
        if pol.lend_weight is not None:
            if pol.lend_weight <= 0:
                diags.append(
                    error(
                        "invalid-value",
                        f"{obj.label}: lend_weight must be above 0, found 0",
                        obj.pos("lend_weight"),
                        "a level's share is its borrowed GPUs / lend_weight: give a number "
                        "above 0 such as 0.5, 1 or 2 (the default is 1)",
                    )
                )
            elif order != "fair":
                diags.append(
                    warning(
                        "lend-weight-unused",
                        f"{obj.label}: lend_weight has no effect while settings.lending.order is "
                        f"{order!r}",
                        obj.pos("lend_weight"),
                        "set settings.lending.order: fair, or remove lend_weight",
                    )
                )
        if pol.protect_for is not None and org.is_envelope(name):
            diags.append(
                error(
                    "protect-for-on-envelope",
                    f"{obj.label} is an envelope (group '{pol.group}' has groups below it), so "
                    "'protect_for' does not apply: protection belongs to the work's own group",
                    obj.pos("protect_for"),
                    "set protect_for on the policies of the teams below, or "
                    "settings.lending.protect_for for every policy",
                )
            )
    return diags
