"""``kliqued plan``: what an estate change does, before it is merged.

Layers, so that only the edges do I/O: ``gitsource`` reads two revisions from git,
``build.make_plan`` compiles and compares them (``diff`` for what changed, ``impact`` for
what it does to work), and the ``render_*`` modules turn the resulting ``Plan`` into text.
"""

from __future__ import annotations

from .build import Side, make_plan
from .model import AttrChange, Impact, ObjectChange, Plan, Revision
from .render_github import render_github
from .render_json import render_json
from .render_markdown import render_markdown
from .render_text import render_text

RENDERERS = {
    "text": render_text,
    "markdown": render_markdown,
    "json": render_json,
    "github": render_github,
}

__all__ = [
    "AttrChange",
    "Impact",
    "ObjectChange",
    "Plan",
    "RENDERERS",
    "Revision",
    "Side",
    "make_plan",
    "render_github",
    "render_json",
    "render_markdown",
    "render_text",
]
