"""``kliqued workers rollout --url`` given several daemons of one control plane (issue 18):
the role's variable carries every URL and the rolled-out worker is given all of them, so it
follows the leader. No Ansible run: the flags go through the real parsers, the variables
through ``workers.rollout.role_vars``, and the role's own expressions and templates are
rendered with Jinja2 as Ansible renders them (as test_rollout.py renders the unit)."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from ruamel.yaml import YAML

from kliqued.cli import build_parser
from kliqued.commands.workers import _connection
from klique_util.leader import split_urls
from workers.cli import parser as worker_parser
from workers.errors import RolloutError
from workers.rollout import ANSIBLE_DIR, role_vars

ROLE = ANSIBLE_DIR / "roles" / "klique_worker"
K1, K2, K3 = "https://k1.example.org:8443", "https://k2.example.org:8443", "https://k3:8443"


def _fact(name: str) -> str:
    """The Jinja2 expression of the role's ``set_fact`` of ``name``."""
    for task in YAML(typ="safe").load((ROLE / "tasks" / "main.yml").read_text()):
        fact = task.get("ansible.builtin.set_fact") or {}
        if name in fact:
            return str(fact[name])
    raise AssertionError(f"no set_fact of {name} in the role")


def _render(text: str, **variables: object) -> str:
    return jinja2.Environment().from_string(text).render(**variables).strip()


def _rendered_for(klique_worker_url: object) -> tuple[str, str, str]:
    """What the role makes of ``klique_worker_url``: the worker's environment file's URL line,
    the URL its registration check asks, and the worker's ``--url`` values."""
    flag = _render(_fact("klique_worker_url_flag"), klique_worker_url=klique_worker_url)
    first = _render(_fact("klique_worker_register_url"), klique_worker_url_flag=flag)
    env = _render(
        (ROLE / "templates" / "worker.env.j2").read_text(),
        klique_worker_url_flag=flag,
        ansible_managed="managed",
        klique_worker_service_name="klique-worker",
    )
    line = next(x for x in env.splitlines() if x.startswith("KLIQUE_WORKER_URL="))
    return line, first, flag


def test_rollout_carries_every_url_to_the_workers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("KLIQUE_URL", raising=False)
    args = build_parser().parse_args(
        [
            "workers",
            "rollout",
            "-i",
            "hosts.ini",
            "--pool",
            "bare",
            "--url",
            K1,
            "--url",
            f"{K2}, {K3}",
            "--admin-token",
            "kq_x",
        ]
    )
    url, _ = _connection(args)
    assert url == f"{K1},{K2},{K3}"  # repeated and comma-separated, as --url everywhere
    ev = role_vars(url, "bare", tmp_path / "worker.token")
    assert ev["klique_worker_url"] == f"{K1},{K2},{K3}"
    line, first, flag = _rendered_for(ev["klique_worker_url"])
    assert line == f"KLIQUE_WORKER_URL={K1},{K2},{K3}"
    assert first == K1  # the registration check asks one (a standby redirects it)
    # the worker reads them back as three daemons of one control plane
    worker = worker_parser().parse_args(["--url", flag, "--pool", "bare", "--token-file", "t"])
    assert split_urls(worker.url) == [K1, K2, K3]
    # the playbook's variable given by hand: a YAML list or an INI tuple work too
    for given in ([K1, K2], (K1, K2), f" {K1} ,{K2},{K1}"):
        assert _rendered_for(given)[0] == f"KLIQUE_WORKER_URL={K1},{K2}", given
    assert _rendered_for(K1) == (f"KLIQUE_WORKER_URL={K1}", K1, K1)  # one, unchanged


def test_rollout_without_a_url_says_so(tmp_path: Path) -> None:
    with pytest.raises(RolloutError, match="no control-plane URL"):
        role_vars(" , ", "bare", tmp_path / "worker.token")
