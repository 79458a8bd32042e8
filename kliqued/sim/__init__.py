"""The simulator: scenarios (scenarios.md) run in simulated time on the daemon's engine."""

from .runner import SimResult, Simulator, simulate
from .scenario import Scenario, ScenarioError, load_scenario

__all__ = ["SimResult", "Simulator", "simulate", "Scenario", "ScenarioError", "load_scenario"]
