"""``kliqued advise``: estate changes that would have shortened real waits (issue 31).

``model`` (the typed records), ``propose`` (the candidate changes, from the replayed weeks'
figures and the estate), ``edit`` (a change applied to the estate's YAML text, recompiled,
and its patch), ``check`` (each candidate replayed with the what-if, kept when it lowers its
group's p95 wait without raising another group's by more than 10%), ``report`` (Markdown).
"""

from __future__ import annotations

from .check import advise
from .model import Advice, Change, Proposal
from .report import render_markdown

__all__ = ["Advice", "Change", "Proposal", "advise", "render_markdown"]
