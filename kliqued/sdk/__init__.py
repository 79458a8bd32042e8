"""The Klique Python SDK: ``from kliqued.sdk import Client``.

A synchronous client over HTTP(S) for the kliqued API, using only the standard library. The
``kliqued`` CLI's user commands (submit, status, queue, cancel, budget, pools, ledger) are
built on it. docs/cli.md has examples.
"""

from .client import Client
from .config import resolve
from .errors import ConfigError, KliqueError

__all__ = ["Client", "KliqueError", "ConfigError", "resolve"]
