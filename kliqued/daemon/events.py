"""Event log records: what happened, in the order it happened.

Kinds (``data`` fields in brackets):
- ``estate_applied`` [source, estate: the compiled estate's JSON]
- ``submitted`` [resource, user, project, gpus_milli, command, payload, labels,
  idempotency_key] (``actor`` is the principal that sent it, ``usr`` the task's user)
- ``placed`` [pool, resource, size_milli, phase, interval]
- ``preempted`` [pool, kind, text, by, interval]
- ``cancelled`` [text, by: request|estate, interval|null]
- ``ended`` [kind: finished|failed, epoch, worker, exit_code, signal, message, interval;
  reason and lost for a task lost the third time] (a worker's report)
- ``worker_registered`` [worker, pool, hostname, executor, gpus, version, key_hash] (the
  keyed hash of the worker's key, which binds the id to that worker: never shown by the API)
- ``leased`` [worker, epoch, pool, size_milli] / ``started`` [worker, epoch, ...] /
  ``stopped`` [worker, epoch, report, reason, exit_code, signal] / ``unleased`` [worker,
  epoch] (a lease its worker never took)
- ``worker_lost`` [worker, pool, tasks] (then each task's ``preempted`` with kind ``lost``)
- ``worker_deregistered`` [worker, pool, tasks] (``DELETE /workers/{id}``; then each
  active lease's task ``preempted`` with kind ``lost``)
- a ``preempted`` with kind ``returned`` is a task its worker handed back on a clean
  shutdown (a ``stopped`` report with ``reason: "shutdown"``): not counted as a loss; an
  ``ended`` with kind ``stopped`` and ``reason: "stopped: idle (cpu 30m)"`` is a session
  the worker stopped for an idle limit
- ``engine_disabled`` / ``engine_enabled``
- ``alert`` [policy, threshold_milli, period_start, used_units, budget_units, text]
- ``token_created`` [id, principal, name, expires_at?, rotated_from?] / ``token_revoked``
  [id] / ``token_rotated`` [id, to, old_ends_at] (the old token ends then: at once, or after
  the rotation's grace)
- ``worker_refused`` [call, worker, holder?, reason] (a worker call that did not prove the
  identity it claims: another worker's id, lease or key; refused with 403)
- ``estate_refused`` [revision, commit, source, errors] (GitOps reload)
- ``waiting_alert`` [resource, task, user, waited_s] (a queue's head waited past
  ``settings.alerts.waiting_after``) / ``alert_delivery`` [alert: the alert event's seq,
  channel, key, attempt, status: failed|delivered|given_up, error?] (docs/alerts.md)

``grp`` and ``usr`` are columns (not only data) so the audit log can be filtered to what a
user may see without parsing JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Event:
    kind: str
    task: str | None = None
    actor: str | None = None
    revision: str | None = None
    grp: str | None = None
    usr: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def row(self, seq: int, at_ms: int) -> tuple:
        return (seq, at_ms, self.kind, self.task, self.actor, self.revision, self.grp,
                self.usr, json.dumps(self.data, separators=(",", ":"), ensure_ascii=False))


COLUMNS = ("seq", "at_ms", "kind", "task", "actor", "revision", "grp", "usr", "data")
