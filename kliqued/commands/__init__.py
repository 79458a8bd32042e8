"""One module per ``kliqued`` subcommand; each exposes ``register(subparsers)``."""
