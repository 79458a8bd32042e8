"""The control plane daemon (``kliqued serve``): durable state, the engine loop, the HTTP API.

One asyncio process owns the DuckDB file. Every change (a submission, a cancellation, an
engine decision, an estate revision, a token) is an event in an append-only log, written with
group commit; the live state is the engine's ``State`` in memory, rebuilt at start by
replaying the log through the State's own methods. See docs/daemon.md; the code is in rooms
(``state``, ``storage``, ``api``, ``fleet``, ``ha``) over a shared floor: README.md here.
"""
