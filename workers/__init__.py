"""Klique worker daemons and their executors (docs/workers.md, docs/worker-protocol.md)."""

try:
    from importlib.metadata import version as _version

    __version__ = _version("klique")
except Exception:  # pragma: no cover - running from a source tree without metadata
    __version__ = "0+unknown"
