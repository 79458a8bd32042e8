"""Counts and names in compiler messages read as English: ``1 error``, ``known policies``
(issue 10, bug 14: ``(1 errors)``)."""

from __future__ import annotations

import re

from compiler.diagnostics import plural, render_all

from .helpers import MINIMAL, compile_text


def test_counts_are_singular_for_one() -> None:
    assert plural(1, "error") == "1 error" and plural(0, "error") == "0 errors"
    assert plural(2, "policy") == "2 policies" and plural(1, "policy") == "1 policy"
    result = compile_text(MINIMAL.replace("policies: [team-a]", "policies: [team-b]"))
    text = render_all(result.diagnostics)
    assert text.endswith("\n1 error, 1 warning"), text


def test_known_names_are_listed_under_a_plural_that_exists() -> None:
    result = compile_text(MINIMAL.replace("policies: [team-a]", "policies: [zzz]"))
    [d] = result.errors
    assert d.hint == "known policies: team-a", d.hint


def test_no_message_says_1_errors_or_doubles_a_quote() -> None:
    bad = re.compile(r"\b1 (errors|warnings|files|pools|policies)\b|''s|policys")
    result = compile_text(
        MINIMAL.replace("policies: [team-a]", "policies: [zzz]").replace(
            "capacity: 8", "capacity: 1"
        )
    )
    for d in result.diagnostics:
        assert not bad.search(d.render()), d.render()
    assert not bad.search(render_all(result.diagnostics))
