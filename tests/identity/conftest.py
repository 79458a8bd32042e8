"""A daemon whose estate trusts the session's real providers (tests/harness/oidc.py): the
``corp`` provider for people, and ``github`` (the Actions-shaped issuer) for the
``example-org/estate`` repository's main branch."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.daemon import SMALL_ESTATE
from tests.harness.inproc import InProcServer
from tests.harness.oidc import Provider


def identity_yaml(people: Provider, actions: Provider, extra: str = "") -> str:
    return f"""\
  identity:
    providers:
      - name: corp
        issuer: {people.issuer}
        audience: klique
        users: {{erin: erin.x@example.org}}
    workloads:
      - name: github
        issuer: {actions.issuer}
        audience: klique
        claims: {{repository: example-org/estate, ref: refs/heads/main}}
    roles: {{admin: [walter], finance: [fiona]}}
{extra}"""


def write_estate(dest: Path, people: Provider, actions: Provider, extra: str = "") -> Path:
    if not dest.exists():
        shutil.copytree(SMALL_ESTATE, dest)
    base = (SMALL_ESTATE / "settings.yaml").read_text()
    (dest / "settings.yaml").write_text(base + identity_yaml(people, actions, extra))
    return dest


@pytest.fixture
def idp_server(
    tmp_path: Path, oidc_people: Provider, oidc_actions: Provider
) -> Iterator[InProcServer]:
    estate = write_estate(tmp_path / "estate", oidc_people, oidc_actions)
    s = InProcServer(tmp_path, estate).start()
    try:
        yield s
    finally:
        s.stop()
