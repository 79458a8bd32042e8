"""The compute policy engine: (compiled estate, state, time) -> decisions.

One set of rules for the daemon and the simulator (engine.md). Pure in the sense that matters:
no I/O, no clock, no randomness; ``run_pass`` mutates only the ``State`` it is given and
returns what it decided. Times are integer milliseconds since the Unix epoch (UTC), amounts
integer milli-GPUs, budget charges integer (weight milli x milliseconds).
"""

from .decisions import (
    UNSTARTED,
    Alert,
    BudgetStatus,
    Cancellation,
    Phase,
    Placement,
    PreemptKind,
    Preemption,
    Reason,
    ReasonKind,
    no_autoscaler_text,
    no_worker_text,
    unstarted_text,
)
from .errors import (
    DuplicateTask,
    EngineError,
    StaleResult,
    SubmissionError,
    TimeWentBackwards,
    UnknownTask,
)
from .index import CRInfo, EstateIndex, GroupInfo, PoolInfo
from .passes import run_pass
from .reasons import budget_status, waiting_reason, waiting_reasons
from .result import PassResult
from .state import ENDED, PLACED, QUEUED, State, Task, check_submission

__all__ = [
    "UNSTARTED",
    "no_autoscaler_text",
    "no_worker_text",
    "unstarted_text",
    "Alert",
    "BudgetStatus",
    "Cancellation",
    "Phase",
    "Placement",
    "PreemptKind",
    "Preemption",
    "Reason",
    "ReasonKind",
    "CRInfo",
    "EstateIndex",
    "GroupInfo",
    "PoolInfo",
    "run_pass",
    "budget_status",
    "waiting_reason",
    "waiting_reasons",
    "PassResult",
    "StaleResult",
    "State",
    "SubmissionError",
    "Task",
    "check_submission",
    "QUEUED",
    "PLACED",
    "ENDED",
    "EngineError",
    "DuplicateTask",
    "UnknownTask",
    "TimeWentBackwards",
]
