"""The Klique Python SDK: ``from kliqued.sdk import Client``.

A synchronous client over HTTP(S) for the kliqued API, on the standard library; its request
bodies are made by the API's models (``kliqued/api_models``, pydantic), loaded at the first
call that sends one. The ``kliqued`` CLI's user commands (submit, status, queue, cancel,
budget, pools, ledger) are built on it. docs/cli.md has examples. Inside a task, ``checkpoint()`` and
``preempt_notice()`` (task.py) speak to its worker, with no URL or token.
"""

from .client import Client
from .config import resolve
from .errors import ConfigError, KliqueError
from .task import checkpoint, preempt_notice

__all__ = ["Client", "KliqueError", "ConfigError", "resolve", "checkpoint", "preempt_notice"]
