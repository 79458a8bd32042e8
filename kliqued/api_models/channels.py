"""The channels a task may come through, as the API names them (issue 14, part 5).

Part of the API's vocabulary (a task's ``channel`` in its answers, the ``X-Klique-Channel``
header a client sends), so it lives with the API's models that the daemon, the SDK and the
MCP tools share; what the daemon does with a channel (who may declare which, how an old row
reads back) stays in ``kliqued.daemon.state.channels``.
"""

from __future__ import annotations

from typing import Literal

Channel = Literal["cli", "sdk", "api", "mcp", "schedule", "pipeline", "session"]

CHANNELS: tuple[Channel, ...] = ("cli", "sdk", "api", "mcp", "schedule", "pipeline", "session")
"""Every channel, in the order docs and the OpenAPI enum list them."""
