"""The SDK against a real running `kliqued serve`."""

from __future__ import annotations

import duckdb
import pytest

from kliqued.sdk import Client, ConfigError, KliqueError

from tests.harness.daemon import free_port
from tests.harness.wait import wait_for


@pytest.fixture
def alice(server):
    return Client(server.url, server.token("alice"))


@pytest.fixture
def admin(server):
    return Client(server.url, server.admin)


@pytest.fixture
def finance(server):
    return Client(server.url, server.token("role:finance"))


def test_whoami_and_reading_the_estate(alice, finance):
    me = alice.whoami()
    assert me["principal"] == "user:alice" and "llm-research" in me["groups"]
    assert finance.whoami()["roles"] == ["finance"]
    names = {r["name"] for r in alice.resources()}
    assert "llm-research/h100" in names and "vision/h100" not in names
    assert {p["name"] for p in alice.pools()} >= {"onprem-k8s", "hpc-slurm"}
    assert alice.estate()["revision"].startswith("sha256:")
    assert alice.engine()["enabled"] in (True, False)
    pol = alice.policy("llm-research")
    assert pol["group"] == "llm-research" and pol["budget"]["period"] == "month"
    assert any(p["name"] == "llm-research" for p in finance.policies())


def test_submit_status_queue_cancel(alice, admin):
    admin.set_engine(False)  # keep the tasks queued while we look at the queue
    try:
        first = alice.submit(
            "llm-research/h100", command=["python", "train.py"], project="rlhf", labels={"run": "1"}
        )
        second = alice.submit("llm-research/h100", command="python eval.py --fast", project="evals")
        assert first["state"] == "queued" and first["user"] == "alice"
        assert first["labels"] == {"run": "1"} and second["command"] == [
            "python",
            "eval.py",
            "--fast",
        ]
        q = alice.queue("llm-research/h100")
        ids = [i["id"] for i in q["queue"]]
        assert ids.index(first["id"]) < ids.index(second["id"])
        assert all(i["waiting_reason"]["text"] for i in q["queue"])
        assert alice.task(second["id"])["position"] >= 2
        mine = {t["id"] for t in alice.tasks(state="queued", page_size=1)}  # pages of one
        assert {first["id"], second["id"]} <= mine
        gone = alice.cancel(second["id"])
        assert gone["state"] == "ended" and gone["end_reason"] == "cancelled"
        assert alice.cancel(second["id"])["end_reason"] == "cancelled"  # idempotent
    finally:
        admin.set_engine(True)
    wait_for(lambda: alice.task(first["id"])["state"] == "placed", what="placement")
    assert alice.task(first["id"])["pool"]
    # The API shows a pass's placement as soon as the pass made it; its event is readable
    # once that cycle's commit lands (docs/daemon.md), milliseconds later.
    assert wait_for(
        lambda: {"submitted", "placed"} <= {e["kind"] for e in alice.events(task=first["id"])}
    ), alice.events(task=first["id"])


def test_idempotency_key_returns_the_first_answer(alice):
    a = alice.submit(
        "llm-research/h100", command=["true"], project="evals", idempotency_key="same-key-1"
    )
    b = alice.submit(
        "llm-research/h100", command=["true"], project="evals", idempotency_key="same-key-1"
    )
    assert a["id"] == b["id"]
    c = alice.submit("llm-research/h100", command=["true"], project="evals")  # a fresh key
    assert c["id"] != a["id"]
    for t in (a, c):
        alice.cancel(t["id"])


def test_refusals_carry_the_servers_error(server, alice, finance):
    with pytest.raises(KliqueError) as err:
        alice.submit("vision/h100", command=["x"])
    assert err.value.status == 422 and err.value.code == "submission-refused"
    assert "vision" in err.value.message
    with pytest.raises(KliqueError) as err:
        alice.task("t-does-not-exist")
    assert err.value.status == 404 and err.value.code == "not-found"
    bob = Client(alice.url, server.token("bob"))  # a member who administers nothing
    with pytest.raises(KliqueError) as err:
        bob.ledger_sql("SELECT 1")
    assert err.value.status == 403
    assert alice.ledger_sql("SELECT 1 AS one")["rows"] == [[1]]  # llm-research's admin
    with pytest.raises(KliqueError) as err:
        finance.submit("llm-research/h100", command=["x"])
    assert err.value.status == 403
    with pytest.raises(KliqueError) as err:
        alice.queue("no-slash")
    assert err.value.code == "invalid-request"


def test_ledger_sql_as_finance(alice, finance):
    t = alice.submit("llm-research/h100", command=["sleep", "1"], project="evals")
    assert wait_for(
        lambda: (
            finance.ledger_sql(f"SELECT count(*) FROM ledger WHERE task = '{t['id']}'")["rows"]
            == [[1]]
        )
    )
    res = finance.ledger_sql(f"""
        SELECT "user", project, gpus, per_gpu_hour, currency, start_at
        FROM usage_priced WHERE task = '{t["id"]}'""")
    assert res["columns"] == ["user", "project", "gpus", "per_gpu_hour", "currency", "start_at"]
    user, project, gpus, price, currency, start = res["rows"][0]
    assert (user, project, gpus, currency) == ("alice", "evals", "1.000", "EUR")
    assert price in ("1.850000", "2.350000", "1.950000") and start.endswith("Z")
    res = finance.ledger_sql("SELECT * FROM range(50)", limit=5)
    assert res["truncated"] and len(res["rows"]) == 5
    for sql, code in [
        ("DELETE FROM ledger", "not-read-only"),
        ("SELECT 1; SELECT 2", "multiple-statements"),
        ("SELECT * FROM read_csv('/etc/passwd')", "not-allowed"),
    ]:
        with pytest.raises(KliqueError) as err:
            finance.ledger_sql(sql)
        assert err.value.code == code and err.value.status == 400
    alice.cancel(t["id"])


def test_export_csv_and_parquet(alice, finance, tmp_path):
    t = alice.submit("llm-research/h100", command=["true"], project="evals")
    assert wait_for(lambda: alice.task(t["id"])["state"] == "placed")
    alice.cancel(t["id"])
    csv_path = finance.ledger_export(
        "2026-01-01T00:00:00Z", "2100-01-01T00:00:00Z", tmp_path / "l.csv"
    )
    header = csv_path.read_text().splitlines()[0]
    assert header.startswith("interval_id,task,user,project,group")
    (tmp_path / "out").mkdir()  # an export creates no directory (issue 9, finding 15)
    pq = finance.ledger_export(
        "2026-01-01T00:00:00Z",
        "2100-01-01T00:00:00Z",
        tmp_path / "out" / "l.parquet",
        format="parquet",
    )
    rows = (
        duckdb.connect()
        .execute(
            f"SELECT task, end_reason, typeof(start_at), typeof(gpus) FROM read_parquet('{pq}') "
            f"WHERE task = '{t['id']}'"
        )
        .fetchall()
    )
    # times are UTC instants (isAdjustedToUTC=true), amounts exact
    assert rows == [(t["id"], "cancelled", "TIMESTAMP WITH TIME ZONE", "DECIMAL(12,3)")]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["l.csv", "l.parquet", "out"]
    with pytest.raises(KliqueError):
        finance.ledger_export(
            "2026-01-01T00:00:00Z", "2100-01-01T00:00:00Z", tmp_path / "x.xlsx", format="xlsx"
        )


def test_wrong_url_and_bad_token(server, no_klique_env):
    port = free_port()  # nothing listens there
    k = Client(f"http://127.0.0.1:{port}", "kq_x", retries=1, backoff_s=0.01)
    with pytest.raises(KliqueError) as err:
        k.whoami()
    assert err.value.status is None and err.value.code == "unreachable"
    assert f"127.0.0.1:{port}" in err.value.message and "kliqued serve" in err.value.message
    with pytest.raises(KliqueError) as err:
        Client(server.url, "kq_not-a-real-token").whoami()
    assert err.value.status == 401 and "token" in err.value.message
    with pytest.raises(ConfigError) as err:
        Client.from_config()
    assert "KLIQUE_URL" in err.value.message and "--url" in err.value.message


def test_config_file_resolution(server, monkeypatch, tmp_path, no_klique_env):
    token_file = tmp_path / "alice.token"
    token_file.write_text(server.token("alice") + "\n")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"""
current-context: local
contexts:
  - name: local
    url: {server.url}
    token-file: alice.token
  - name: finance
    url: {server.url}
    token: {server.token("role:finance")}
  - name: elsewhere
    url: http://127.0.0.1:9
    token: kq_nope
""")
    monkeypatch.setenv("KLIQUE_CONFIG", str(cfg))
    assert Client.from_config().whoami()["name"] == "alice"  # current-context
    assert Client.from_config(context="finance").whoami()["roles"]  # --context
    # the environment beats the current context, an explicit --context beats the environment
    monkeypatch.setenv("KLIQUE_TOKEN", server.token("role:finance"))
    assert Client.from_config().whoami()["principal"] == "role:finance"
    assert Client.from_config(context="local").whoami()["name"] == "alice"
    # explicit arguments beat everything
    assert (
        Client.from_config(token=server.token("alice"), context="finance").whoami()["name"]
        == "alice"
    )
    assert Client.from_config(context="elsewhere").url == "http://127.0.0.1:9"
    with pytest.raises(ConfigError) as err:
        Client.from_config(context="nope")
    assert "no context 'nope'" in err.value.message and "local, finance" in err.value.message
