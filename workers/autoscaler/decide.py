"""The scaling decision: a pure function from what the loop observed to what it should do.

``decide(Observation) -> list[Action]``: no clock, no I/O, so every rule is a unit test.

- **Demand** is the pool's placed tasks that no node runs yet (``waiting``, in milli-GPUs).
  They are packed first into the room of the nodes there are (a node still starting counts:
  it will take work as soon as its worker registers), largest first, first fit.
- **Launch** new nodes only for what does not fit: each new node has ``node_gpus`` GPUs (or
  as many as one task needs, if more), the waiting tasks are packed into them first fit
  decreasing, and a node is launched only while the pool's GPUs (every node, starting or
  not, plus the new ones) stay within ``max``. A task bigger than what is left waits.
- **Spot first**: a launch asks for spot when the pool says ``spot_first`` and spot was not
  refused in the last ``spot_retry_s``; the loop records a refusal (``CapacityUnavailable``)
  as ``spot_unavailable_until`` and asks again, and the same rules then ask for on-demand.
- **Release** a node that is up, runs nothing, was given none of the waiting work in this
  decision, and has run nothing for ``idle_timeout_s``. A node whose worker never came up
  within ``launch_timeout_s``, or is gone, is released too.
- **No flapping**: a node launched for work counts as room at once, so the next decision does
  not launch again for the same work; a node is released only after a whole idle timeout,
  and never in a decision that gives it work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MILLI = 1000


@dataclass(frozen=True)
class ScalePolicy:
    max_milli: int
    idle_timeout_s: float
    spot_first: bool = True
    node_gpus: int = 1
    spot_retry_s: float = 300.0
    launch_timeout_s: float = 300.0

    @property
    def max_gpus(self) -> int:
        return self.max_milli // MILLI


@dataclass(frozen=True)
class NodeView:
    id: str
    gpus: int
    spot: bool
    launched_at: float
    up: bool = True  # its worker runs (a starting node: False)
    gone: bool = False  # it died or was taken away (spot reclaimed)
    used_milli: int = 0  # what the tasks it runs take
    idle_since: float | None = None  # since when it runs nothing (None: it runs something)

    @property
    def free_milli(self) -> int:
        return max(0, self.gpus * MILLI - self.used_milli)


@dataclass(frozen=True)
class Observation:
    now: float
    policy: ScalePolicy
    nodes: tuple[NodeView, ...] = ()
    waiting: tuple[int, ...] = ()  # milli-GPUs of each placed task no node runs yet
    spot_unavailable_until: float = float("-inf")


@dataclass(frozen=True)
class Launch:
    gpus: int
    spot: bool
    for_milli: tuple[int, ...] = field(default=(), compare=False)  # the work it is for


@dataclass(frozen=True)
class Terminate:
    node: str
    reason: str


Action = Launch | Terminate


def _fit(rooms: list[int], milli: int) -> int | None:
    for i, room in enumerate(rooms):
        if room >= milli:
            return i
    return None


def decide(obs: Observation) -> list[Action]:
    pol, now = obs.policy, obs.now
    actions: list[Action] = []
    live = [n for n in obs.nodes if not n.gone]
    for n in obs.nodes:
        if n.gone:
            actions.append(Terminate(n.id, "gone"))
    stuck = {n.id for n in live if not n.up and now - n.launched_at >= pol.launch_timeout_s}
    for n in live:
        if n.id in stuck:
            actions.append(
                Terminate(n.id, f"its worker did not come up within {pol.launch_timeout_s:g}s")
            )
    live = [n for n in live if n.id not in stuck]

    # 1. the waiting work goes to the room there is
    rooms = [n.free_milli for n in live]
    given: set[int] = set()
    unfit: list[int] = []
    for milli in sorted(obs.waiting, reverse=True):
        i = _fit(rooms, milli)
        if i is None:
            unfit.append(milli)
        else:
            rooms[i] -= milli
            given.add(i)

    # 2. idle nodes that got no work are released after the idle timeout
    for i, n in enumerate(live):
        if (
            n.up
            and i not in given
            and n.used_milli == 0
            and n.idle_since is not None
            and now - n.idle_since >= pol.idle_timeout_s
        ):
            actions.append(
                Terminate(
                    n.id,
                    f"idle for {now - n.idle_since:.0f}s (idle timeout {pol.idle_timeout_s:g}s)",
                )
            )

    # 3. new nodes for the rest, within max (released nodes still count until they are gone,
    #    so a release and a launch never race past max)
    total = sum(n.gpus for n in live)
    spot = pol.spot_first and now >= obs.spot_unavailable_until
    new: list[tuple[int, list[int]]] = []  # (gpus, [milli of its tasks])
    new_rooms: list[int] = []
    for milli in unfit:  # already largest first
        i = _fit(new_rooms, milli)
        if i is not None:
            new_rooms[i] -= milli
            new[i][1].append(milli)
            continue
        size = max(pol.node_gpus, -(-milli // MILLI))
        if total + size > pol.max_gpus:
            continue  # waits: the pool is at its max
        total += size
        new.append((size, [milli]))
        new_rooms.append(size * MILLI - milli)
    actions.extend(Launch(gpus, spot, tuple(work)) for gpus, work in new)
    return actions


def track_idle(previous: dict[str, float], used: dict[str, int], now: float) -> dict[str, float]:
    """Since when each node runs nothing: kept across observations (``previous``), started at
    ``now`` for a node found empty, dropped for a node found busy or gone."""
    out = {}
    for node, milli in used.items():
        if milli == 0:
            out[node] = previous.get(node, now)
    return out
