"""``settings.identity`` (issue 30): the providers people sign in with, the CI issuers jobs
are trusted from and the roles, compiled; and the errors that keep a sign-in from naming
the wrong person or trusting the wrong job, each at its line with a hint."""

from __future__ import annotations

from compiler.api import CompileResult

from tests.harness.typed import present

from .helpers import MINIMAL, compile_text

GROUPS = "  - {name: team-a, users: [alice]}\n"


def with_identity(identity: str, users: str = "[alice, bob]") -> CompileResult:
    text = MINIMAL.replace(GROUPS, f"  - {{name: team-a, users: {users}}}\n")
    return compile_text(text + "settings:\n  identity:\n" + identity)


PROVIDER = """\
    providers:
      - name: corp
        issuer: https://login.example.org/realms/research
        audience: klique
"""


def errors(r: CompileResult) -> list[tuple[str, int, str]]:
    return [
        (d.code, present(d.pos).line, d.message)
        for d in r.diagnostics
        if d.severity.value == "error"
    ]


def test_a_provider_compiles_with_its_defaults() -> None:
    r = with_identity(
        PROVIDER
        + "        user_claim: email\n"
        + "        users: {alice: a.smith@example.org}\n"
        + "    roles: {admin: [alice], finance: [fiona]}\n"
    )
    assert r.ok, [d.render() for d in r.diagnostics]
    ident = present(present(r.estate).settings.identity)
    corp = ident.providers[0]
    assert (corp.client_id, corp.algorithms, corp.leeway_s) == ("klique", ["RS256", "ES256"], 60)
    assert corp.users == {"a.smith@example.org": "alice"}  # the look-up a sign-in makes
    assert ident.roles["finance"] == ["fiona"] and ident.in_estate("fiona")
    assert ident.token_lifetime_s == 8 * 3600


def test_an_estate_without_identity_keeps_its_revision() -> None:
    plain = compile_text(MINIMAL)
    assert "identity" not in present(plain.estate).canonical_json()
    with_it = with_identity(PROVIDER)
    assert present(with_it.estate).revision != present(plain.estate).revision


def test_two_users_with_one_claim_value_is_an_error_naming_both() -> None:
    r = with_identity(PROVIDER + "        users: {alice: a@example.org, bob: a@example.org}\n")
    assert not r.ok
    [(code, line, message)] = errors(r)
    assert code == "claim-maps-to-two-users"
    assert "'alice' and 'bob'" in message and line == 17


def test_a_value_that_is_another_users_name_is_an_error() -> None:
    r = with_identity(PROVIDER + "        users: {alice: bob}\n")
    [(code, _, message)] = errors(r)
    assert code == "claim-maps-to-two-users" and "also the estate user" in message


def test_mapping_a_claim_to_nobody_is_an_error() -> None:
    r = with_identity(PROVIDER + "        users: {alica: a@example.org}\n")
    [(code, _, message)] = errors(r)
    assert code == "unknown-user" and "'alica'" in message


def test_unsigned_and_shared_secret_algorithms_cannot_be_written() -> None:
    for alg in ("none", "HS256"):
        r = with_identity(PROVIDER + f"        algorithms: [{alg}]\n")
        assert not r.ok
        assert any("algorithms" in d.render() for d in r.diagnostics), alg


def test_an_issuer_over_plain_http_is_refused_off_the_loopback() -> None:
    r = with_identity(PROVIDER.replace("https://login", "http://login"))
    assert not r.ok
    assert any("must use https" in d.render() for d in r.diagnostics)
    assert with_identity(PROVIDER.replace("https://login.example.org", "http://127.0.0.1:8080")).ok


WORKLOAD = """\
    workloads:
      - name: github
        issuer: https://token.actions.githubusercontent.com
        audience: klique
"""


def test_a_workload_must_name_its_repository() -> None:
    r = with_identity(WORKLOAD + "        claims: {ref: refs/heads/main}\n")
    [(code, line, message)] = errors(r)
    assert code == "workload-unscoped" and "other repositories" in message and line == 17
    ok = with_identity(
        WORKLOAD + "        claims: {repository: example-org/estate, ref: refs/heads/main}\n"
    )
    assert ok.ok, [d.render() for d in ok.diagnostics]
    assert present(ok.estate).settings.identity is not None


def test_one_issuer_twice_and_a_long_leeway_are_errors() -> None:
    r = with_identity(
        PROVIDER
        + "        leeway: 10m\n"
        + WORKLOAD.replace("    workloads:\n", "    workloads:\n").replace(
            "https://token.actions.githubusercontent.com",
            "https://login.example.org/realms/research",
        )
        + "        claims: {repository: a/b}\n"
    )
    got = {code for code, _, _ in errors(r)}
    assert got == {"duplicate-issuer", "invalid-value"}
