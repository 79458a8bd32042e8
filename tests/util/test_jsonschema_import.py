"""``kliqued serve`` starts without jsonschema's IRI grammar (klique_util/jsonschema_import.py:
2.3 s of every daemon start, and of every test that starts one), and jsonschema still works.
Each check runs in a fresh interpreter, since this one may have imported jsonschema already."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.slow  # long on its own: make test, not make check
def test_the_daemon_imports_without_the_iri_grammar() -> None:
    assert (
        run("import sys, kliqued.daemon.server; print('rfc3987_syntax' in sys.modules)") == "False"
    )


@pytest.mark.slow  # long on its own: make test, not make check
def test_jsonschema_validates_and_the_grammar_stays_importable() -> None:
    code = (
        "from klique_util.jsonschema_import import import_jsonschema\n"
        "js = import_jsonschema()\n"
        "v = js.Draft202012Validator({'type': 'object', 'required': ['a']})\n"
        "print(sorted(e.message for e in v.iter_errors({})))\n"
    )
    assert run(code) == "[\"'a' is a required property\"]"
    if importlib.util.find_spec("rfc3987_syntax") is None:
        pytest.skip("rfc3987_syntax is not installed: nothing was blocked")
    assert (
        run(
            "from klique_util.jsonschema_import import import_jsonschema\n"
            "import_jsonschema()\nimport rfc3987_syntax\nprint('ok')"
        )
        == "ok"
    )
