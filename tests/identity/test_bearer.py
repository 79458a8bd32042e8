"""People and CI jobs reach the API with their identity provider's tokens (issue 30), checked
against a real OpenID Provider (npm oidc-provider): a person's ID token as a bearer token or
exchanged for a short-lived Klique token, a role only where the estate gives it, a CI job's
token acting as planner under its claim conditions, every sign-in audited with provider and
subject and no token anywhere in the log; a removal from the estate ends a sign-in's token at
once; an unreachable provider is a clear 503 while the daemon keeps serving."""

from __future__ import annotations

import re
from pathlib import Path

from tests.harness.inproc import InProcServer
from tests.harness.oidc import Provider, id_token
from tests.harness.wait import wait_for

from tests.harness.oidc_estate import write_estate


def events(s: InProcServer, kind: str) -> list[dict]:
    return s.ok("GET", f"/v1/events?kind={kind}")["events"]


def test_a_persons_id_token_is_a_bearer_token_and_audited(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    s = idp_server
    token = id_token(oidc_people, "alice")
    me = s.ok("GET", "/v1/whoami", token=token)
    assert me["principal"] == "user:alice"
    s.ok("GET", "/v1/whoami", token=token)  # the second use is not audited again
    [ev] = events(s, "signed_in")
    assert ev["data"]["provider"] == "corp" and ev["data"]["subject"] == "alice"
    assert ev["data"]["via"] == "bearer" and ev["actor"] == "user:alice"
    signature = token.rsplit(".", 1)[1]
    assert signature not in s.log()
    assert signature not in str(s.ok("GET", "/v1/events"))


def test_an_id_token_buys_a_klique_token_of_the_estate_lifetime(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    s = idp_server
    got = s.ok("POST", "/v1/signin", {"id_token": id_token(oidc_people, "alice")}, token=None)
    assert got["principal"] == "user:alice" and got["token"].startswith("kq_")
    assert s.ok("GET", "/v1/whoami", token=got["token"])["principal"] == "user:alice"
    [ev] = events(s, "signed_in")
    assert ev["data"]["via"] == "signin" and ev["data"]["token"] == got["id"]
    listed = {t["id"]: t for t in s.ok("GET", "/v1/tokens")["tokens"]}
    assert listed[got["id"]]["created_by"] == "signin:corp:alice"
    providers = s.ok("GET", "/v1/signin", token=None)["providers"]
    assert providers == [
        {
            "name": "corp",
            "issuer": oidc_people.issuer,
            "client_id": "klique",
            "scopes": ["openid", "profile", "email"],
        }
    ]


def test_a_claim_value_mapped_in_the_estate_names_its_user(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    """The estate maps erin to the preferred_username erin.x@example.org: that value names
    her, and the bare name 'erin' (someone else at the provider, perhaps) names no one."""
    s = idp_server
    status, body = s.call("GET", "/v1/whoami", token=id_token(oidc_people, "erin"))
    assert status == 403 and "maps the user erin to another value" in body["error"]["message"]
    me = s.ok("GET", "/v1/whoami", token=id_token(oidc_people, "erin.x@example.org"))
    assert me["principal"] == "user:erin"


def test_a_role_only_where_the_estate_gives_it(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    s = idp_server
    walter = id_token(oidc_people, "walter")
    got = s.ok("POST", "/v1/signin", {"id_token": walter, "role": "admin"}, token=None)
    assert got["principal"] == "role:admin"
    s.ok("GET", "/v1/tokens", token=got["token"])  # an admin's call
    status, body = s.call(
        "POST",
        "/v1/signin",
        {"id_token": id_token(oidc_people, "bob"), "role": "admin"},
        token=None,
    )
    assert status == 403 and "does not hold the role 'admin'" in body["error"]["message"]


def test_a_ci_job_acts_as_planner_under_its_claim_conditions(
    idp_server: InProcServer, oidc_actions: Provider
) -> None:
    s = idp_server
    job = oidc_actions.actions_token("klique")
    state = s.ok("GET", "/v1/plan/state", token=job)
    assert state["revision"].startswith("sha256:")
    assert s.call("GET", "/v1/tasks", token=job)[0] == 403  # planner only
    [ev] = events(s, "signed_in")
    assert ev["data"]["provider"] == "github" and ev["actor"] == "role:planner"
    assert ev["data"]["subject"] == "repo:example-org/estate:ref:refs/heads/main"
    other = oidc_actions.actions_token("klique", ref="refs/heads/feature")
    status, body = s.call("GET", "/v1/plan/state", token=other)
    assert status == 403
    assert "ref is 'refs/heads/feature'" in body["error"]["message"]
    fork = oidc_actions.actions_token("klique", repository="mallory/estate")
    assert s.call("GET", "/v1/plan/state", token=fork)[0] == 403
    status, body = s.call("POST", "/v1/signin", {"id_token": job}, token=None)
    assert status == 403 and "workload issuer" in body["error"]["message"]


def test_removing_a_user_from_the_estate_ends_their_sign_in_at_once(
    tmp_path: Path, idp_server: InProcServer, oidc_people: Provider, oidc_actions: Provider
) -> None:
    s = idp_server
    bob = s.ok("POST", "/v1/signin", {"id_token": id_token(oidc_people, "bob")}, token=None)
    walter = s.ok(
        "POST",
        "/v1/signin",
        {"id_token": id_token(oidc_people, "walter"), "role": "admin"},
        token=None,
    )
    bearer = id_token(oidc_people, "bob")
    assert s.ok("GET", "/v1/whoami", token=bob["token"])["principal"] == "user:bob"
    before = s.ok("GET", "/v1/estate")["revision"]
    estate = tmp_path / "estate"
    groups = (estate / "groups.yaml").read_text()
    (estate / "groups.yaml").write_text(groups.replace("users: [alice, bob]", "users: [alice]"))
    write_estate(estate, oidc_people, oidc_actions).joinpath("settings.yaml").write_text(
        (estate / "settings.yaml").read_text().replace("admin: [walter]", "admin: []")
    )
    wait_for(lambda: s.ok("GET", "/v1/estate")["revision"] != before, 20, "the new revision")
    status, body = s.call("GET", "/v1/whoami", token=bob["token"])
    assert status == 401 and "bob is no longer in the running estate" in body["error"]["message"]
    status, body = s.call("GET", "/v1/tokens", token=walter["token"])
    assert status == 401 and "no longer holds the role admin" in body["error"]["message"]
    status, body = s.call("GET", "/v1/whoami", token=bearer)
    assert status == 403 and "in no group of the running estate" in body["error"]["message"]


def test_an_unreachable_provider_is_a_clear_503_and_the_daemon_serves_on(
    tmp_path: Path, oidc_people: Provider, oidc_actions: Provider
) -> None:
    """A third provider in the estate whose issuer answers nothing (a port with no listener):
    a token naming it gets a 503 that names the provider; the daemon keeps serving."""
    from tests.harness.daemon import free_port
    from tests.security.forged import forge

    dead = f"http://127.0.0.1:{free_port()}"
    extra = f"      - name: down\n        issuer: {dead}\n        audience: klique\n"
    estate = write_estate(tmp_path / "estate", oidc_people, oidc_actions)
    text = (estate / "settings.yaml").read_text()
    (estate / "settings.yaml").write_text(
        text.replace("    workloads:\n", extra + "    workloads:\n")
    )
    s = InProcServer(tmp_path, estate).start()
    try:
        status, body = s.call("GET", "/v1/whoami", token=forge(dead, "klique", "alice"))
        assert status == 503, body
        assert body["error"]["code"] == "provider-unreachable"
        assert re.search(
            rf"identity provider {re.escape(dead)} could not be read", body["error"]["message"]
        )
        assert s.ok("GET", "/v1/health", token=None)["status"] == "ok"
        assert (
            s.ok("GET", "/v1/whoami", token=id_token(oidc_people, "alice"))["principal"]
            == "user:alice"
        )
    finally:
        s.stop()


def test_a_silent_provider_holds_one_request_not_the_daemon(
    tmp_path: Path, oidc_people: Provider, oidc_actions: Provider
) -> None:
    """A provider that accepts connections and never answers (a listening socket nobody
    reads): the token's request waits for the fetch's timeout (5 s, on a thread) and gets a
    503 naming the provider, while the daemon answers everything else at once."""
    import socket
    import threading
    import time

    from tests.security.forged import forge

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the kernel's backlog; nothing ever answers
    issuer = f"http://127.0.0.1:{silent.getsockname()[1]}"
    extra = f"      - name: silent\n        issuer: {issuer}\n        audience: klique\n"
    estate = write_estate(tmp_path / "estate", oidc_people, oidc_actions)
    text = (estate / "settings.yaml").read_text()
    (estate / "settings.yaml").write_text(
        text.replace("    workloads:\n", extra + "    workloads:\n")
    )
    s = InProcServer(tmp_path, estate).start()
    try:
        answer: list[tuple[int, dict]] = []
        waiting = threading.Thread(
            target=lambda: answer.append(
                s.call("GET", "/v1/whoami", token=forge(issuer, "klique", "alice"))
            )
        )
        started = time.monotonic()
        waiting.start()
        wait_for(lambda: waiting.is_alive() and time.monotonic() - started > 0.5, 5, "the wait")
        for _ in range(5):  # the daemon serves while the fetch waits
            t = time.monotonic()
            assert s.ok("GET", "/v1/health", token=None)["status"] == "ok"
            assert time.monotonic() - t < 1.0
        waiting.join(30)
        [(status, body)] = answer
        assert status == 503 and body["error"]["code"] == "provider-unreachable"
        assert issuer in body["error"]["message"]
        assert 4.0 < time.monotonic() - started < 20
    finally:
        s.stop()
        silent.close()


def test_a_schedule_is_bound_to_a_klique_token_not_the_providers(
    idp_server: InProcServer, oidc_people: Provider
) -> None:
    """A schedule runs on the token of the request that made it and pauses when it ends:
    the provider's own token is refused there, with what to do; the Klique token of a
    sign-in is taken."""
    s = idp_server
    body = {"cron": "0 2 * * *", "resource": "team-a/one", "command": ["true"]}
    jwt = id_token(oidc_people, "bob")
    status, refused = s.call("POST", "/v1/schedules", body, token=jwt)
    assert status == 409 and "kliqued login" in refused["error"]["message"]
    got = s.ok("POST", "/v1/signin", {"id_token": jwt}, token=None)
    made = s.ok("POST", "/v1/schedules", body, token=got["token"], expect=201)
    assert made["token"] == got["id"] and made["state"] == "active"
