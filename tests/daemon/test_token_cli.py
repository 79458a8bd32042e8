"""``kliqued token`` against a real daemon: create (the token alone on stdout), list, revoke."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.harness.daemon import ROOT, Server


def kliqued(server: Server, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KLIQUE_URL": server.url, "KLIQUE_TOKEN": server.admin or ""}
    return subprocess.run(
        [sys.executable, "-m", "kliqued.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_token_create_list_revoke(server: Server) -> None:
    p = kliqued(server, "token", "create", "--user", "alice", "--name", "cli")
    assert p.returncode == 0, p.stderr
    token = p.stdout.strip()
    assert token.startswith("kq_") and "user:alice" in p.stderr
    assert server.ok("GET", "/v1/whoami", token=token)["name"] == "alice"
    tid = p.stderr.split()[1]
    listed = kliqued(server, "token", "list")
    assert listed.returncode == 0 and tid in listed.stdout and "user:alice" in listed.stdout
    w = kliqued(server, "token", "create", "--worker", "--pool", "pool-1", "--json")
    assert w.returncode == 0 and '"principal": "worker:pool-1"' in w.stdout
    assert kliqued(server, "token", "create", "--worker").returncode == 2
    assert kliqued(server, "token", "revoke", tid).returncode == 0
    assert server.call("GET", "/v1/whoami", token=token)[0] == 401
    bad = kliqued(server, "token", "create", "--role", "finance", "--token", "kq_nope")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr


def test_token_expires_and_rotate(server: Server) -> None:
    """Issue 10: ``--expires 90d``, ``token rotate ID [--grace]``, expiry in ``token list``."""
    p = kliqued(server, "token", "create", "--user", "alice", "--expires", "90d", "--json")
    assert p.returncode == 0, p.stderr
    made = json.loads(p.stdout)
    assert made["expires_at"] is not None
    listed = kliqued(server, "token", "list")
    assert "EXPIRES" in listed.stdout and made["expires_at"] in listed.stdout
    r = kliqued(server, "token", "rotate", made["id"], "--grace", "1h")
    assert r.returncode == 0, r.stderr
    new = r.stdout.strip()
    assert new.startswith("kq_") and "keeps working for 1h" in r.stderr
    assert server.ok("GET", "/v1/whoami", token=new)["name"] == "alice"
    assert server.ok("GET", "/v1/whoami", token=made["token"])["name"] == "alice"  # grace
    new_id = r.stderr.split()[1]  # "rotated: tk-... for user:alice ..."
    again = kliqued(server, "token", "rotate", new_id)
    assert again.returncode == 0 and "is revoked" in again.stderr, again.stderr
    assert server.call("GET", "/v1/whoami", token=new)[0] == 401  # no grace: at once
    bad = kliqued(server, "token", "create", "--user", "alice", "--expires", "soon")
    assert bad.returncode == 1 and "expires_in" in bad.stderr and "Traceback" not in bad.stderr
