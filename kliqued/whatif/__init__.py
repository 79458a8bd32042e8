"""``kliqued plan --what-if``: real demand replayed on the base and the head estate.

``demand`` reads a demand file (``kliqued demand export``) into rows, ``replay`` runs them on
one estate with the simulator's trace replay (the daemon's engine, in simulated time) and
``compare`` turns both runs into the plan's ``WhatIf`` (compiler/plan/whatif.py), which every
plan renderer shows.
"""

from __future__ import annotations

from .compare import what_if
from .demand import DemandError, read_demand, read_demand_text

__all__ = ["DemandError", "read_demand", "read_demand_text", "what_if"]
