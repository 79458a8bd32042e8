"""``jsonschema`` imported without the grammar it never uses here.

Why: jsonschema imports ``rfc3987_syntax`` at import time when it is installed (it comes with
``jsonschema[format]``, which the test tools pull in), and that module builds a Lark grammar
for IRIs on import: 2.3 s of CPU in every process that validates a request, more than the
rest of ``kliqued serve``'s start together. The daemon validates request bodies without a
format checker (formats are annotations in its OpenAPI document), so the IRI grammar is never
used; blocking its import for the duration of jsonschema's own import costs nothing and the
block is lifted at once (a later ``import rfc3987_syntax`` elsewhere works as usual).
"""

from __future__ import annotations

import sys
from types import ModuleType

_GRAMMAR = "rfc3987_syntax"


def import_jsonschema() -> ModuleType:
    """``jsonschema``, imported (once) without loading ``rfc3987_syntax``."""
    if "jsonschema" in sys.modules:
        return sys.modules["jsonschema"]
    blocked = _GRAMMAR not in sys.modules
    if blocked:
        sys.modules[_GRAMMAR] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import jsonschema
    finally:
        if blocked:
            del sys.modules[_GRAMMAR]
    module: ModuleType = jsonschema  # an untyped package: mypy sees Any, it is a module
    return module
