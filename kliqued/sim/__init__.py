"""The simulator: scenarios (scenarios.md) and trace replays run in simulated time on the
daemon's engine."""

from .runner import Driver, SimResult, Simulator, simulate
from .scenario import Scenario, ScenarioError, load_scenario

__all__ = [
    "Driver",
    "SimResult",
    "Simulator",
    "simulate",
    "Scenario",
    "ScenarioError",
    "load_scenario",
]
