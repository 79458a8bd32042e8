"""A pool's ``settings`` (extension): keys no executor of the pool's kind reads are a
warning (``pool-setting-unknown``: a typo such as ``acount`` must not pass silently, and a
setting meant for another scheduler is named), and a value that could never work is an
error (``pool-setting``: a namespace that is no DNS label, an account with a space, which
sbatch would read as two words). The vocabulary is ``klique_util.poolsettings``, which the
worker's executors read too.
"""

from __future__ import annotations

from klique_util import poolsettings as ps

from .diagnostics import Diagnostic, error, warning
from .models import Pool
from .source import SourceObject


def check_pool_settings(pools: dict[str, SourceObject[Pool]]) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    for obj in pools.values():
        pool: Pool = obj.model
        values = pool.settings
        for key, value in values.items():
            problem = ps.value_problem(key, value)
            if problem is not None:
                diags.append(
                    error(
                        "pool-setting",
                        f"{obj.label}: settings.{problem}",
                        obj.pos("settings", key),
                        "fix the value; it is passed to "
                        "the pool's workers as it is (docs/executors.md)",
                    )
                )
            elif not ps.known_to(pool.kind, values, key):
                runs = ", ".join(ps.executors_of(pool.kind, values))
                diags.append(
                    warning(
                        "pool-setting-unknown",
                        f"{obj.label}: no executor of a {pool.kind} pool ({runs}) reads "
                        f"settings.{key}",
                        obj.pos("settings", key, key=True),
                        f"known here: {', '.join(ps.keys_for(pool.kind, values))}; a worker "
                        f'ignores the others (docs/executors.md, "Pool settings")',
                    )
                )
    return diags
