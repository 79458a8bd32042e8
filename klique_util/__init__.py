"""Small, dependency-free helpers that every layer may import: the compiler, the engine, the
daemon, the CLI and a worker host alike.

They live outside ``compiler`` and ``kliqued`` so that importing one of them loads nothing
else: a worker host gets its atomic write or its milli-GPU conversion without the compiler,
and the compiler gets its units without the daemon. The import contracts in pyproject.toml
(``lint-imports``) keep it that way: this package imports only the standard library.

- ``units``: milli-GPUs, hours and milliseconds (the one place these conversions live)
- ``files``: ``write_atomic`` / ``atomic_path`` (temporary file and rename)
- ``filemodes``: private umask and file modes for files holding commands, tokens or logs
- ``fmt``: hours and costs as people read them
- ``cli``: the argparse help formatter both ``kliqued`` and ``klique-worker`` use
- ``gpufit``: which GPUs of a worker a task goes on (the worker places by it, the daemon
  leases by it)
"""
