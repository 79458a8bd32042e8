"""The estate of the sign-in tests (tests/identity, tests/security/test_oidc_*.py; the root
conftest's ``idp_server``): the small estate trusting the session's real providers
(tests/harness/oidc.py), ``corp`` for people and ``github`` (the Actions-shaped issuer) for
the ``example-org/estate`` repository's main branch."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.harness.daemon import SMALL_ESTATE
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
