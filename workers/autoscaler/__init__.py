"""The cloud autoscaler: adds nodes to a ``kind: cloud`` pool with ``autoscale`` when placed
work waits there (spot first, on-demand as the fallback, up to ``autoscale.max``) and
releases a node idle for ``autoscale.idle_timeout``. docs/autoscaling.md.

- ``decide``: the scaling decision, a pure function;
- ``providers``: the Provider interface and the built-in ``local`` provider;
- ``ec2``: the EC2 provider; ``registry``: the providers by name (``make_provider``);
- ``loop``: observe (control plane + provider), decide, act.

Run it with ``kliqued autoscale --pool NAME --provider local``.
"""

from workers.autoscaler.decide import Launch, NodeView, Observation, ScalePolicy, Terminate, decide
from workers.autoscaler.loop import Autoscaler
from workers.autoscaler.providers import CapacityUnavailable, LocalProvider, Node, Provider
from workers.autoscaler.registry import make_provider

__all__ = [
    "Autoscaler",
    "CapacityUnavailable",
    "Launch",
    "LocalProvider",
    "Node",
    "NodeView",
    "Observation",
    "Provider",
    "ScalePolicy",
    "Terminate",
    "decide",
    "make_provider",
]
