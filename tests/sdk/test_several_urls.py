"""Several URLs of one control plane (docs/ha.md) with a real daemon: the SDK and the CLI
skip a daemon that is not there, from ``--url`` repeated, a comma list in KLIQUE_URL or
``Client([...])``; the list rule itself (klique_util/leader.py). The standby's redirect and a
takeover are tested against real standbys in tests/daemon/test_failover.py."""

from __future__ import annotations

import pytest

from klique_util.leader import Leader, split_urls
from kliqued.sdk import Client, KliqueError
from tests.harness.daemon import free_port


def test_split_urls_takes_repeats_and_commas_once_in_order() -> None:
    assert split_urls(["http://a:1, http://b:2", "http://a:1", " ", "http://c:3"]) == [
        "http://a:1",
        "http://b:2",
        "http://c:3",
    ]
    assert split_urls("http://a:1") == ["http://a:1"]
    assert split_urls(None) == []


def test_a_redirect_is_followed_only_to_a_listed_url() -> None:
    ring = Leader(["http://a:1", "https://B.example", "http://c:3"])
    assert ring.follow("https://b.example:443/v1/tasks?x=1") == "https://B.example"
    assert ring.follow("http://elsewhere:1/v1/tasks") == "http://c:3"  # not followed: next
    assert ring.next() == "http://a:1"
    # the leader a daemon names is used only when listed (kliqued mcp's relay)
    assert ring.prefer("http://c:3") and ring.current == "http://c:3"
    assert not ring.prefer("http://elsewhere:1") and ring.current == "http://c:3"
    assert not ring.prefer(None) and ring.current == "http://c:3"


def test_the_sdk_skips_a_daemon_that_is_not_there(server, no_klique_env) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    k = Client([dead, server.url], server.token("alice"), failover_s=10)
    task = k.submit("llm-research/h100", command=["true"], project="rlhf")  # refused: safe
    assert k.url == server.url
    assert (
        Client(f"{dead},{server.url}", server.token("alice")).task(task["id"])["id"] == task["id"]
    )


def test_with_one_url_a_dead_daemon_is_still_a_clear_error(no_klique_env) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(KliqueError, match="cannot reach"):
        Client(dead, "kq_x", retries=0).whoami()


def test_the_cli_takes_url_repeated_and_klique_url_with_commas(
    server, run, monkeypatch, no_klique_env
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    token = server.token("alice")
    rc, out, err = run(["whoami", "--url", dead, "--url", server.url, "--token", token])
    assert rc == 0, err
    assert "user:alice" in out
    monkeypatch.setenv("KLIQUE_URL", f"{dead},{server.url}")
    monkeypatch.setenv("KLIQUE_TOKEN", token)
    rc, out, err = run(["whoami"])
    assert rc == 0, err
    assert f"(server {server.url})" in out
