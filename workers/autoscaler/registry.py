"""The providers by name (``kliqued autoscale --provider NAME``).

Apart from providers.py because the EC2 provider builds on it (``LocalProvider``, ``Node``,
``Provider``): a factory there that names ``Ec2Provider`` made providers <-> ec2 an import
cycle (grimp counts imports inside functions). Here the arrows go one way: registry ->
providers, registry -> ec2 -> providers.
"""

from __future__ import annotations

from workers.autoscaler.providers import LocalProvider, Provider

PROVIDERS = ("local", "ec2")


def make_provider(
    name: str,
    config: dict,
    url: str | None = None,
    token_file: str | None = None,
    revision: str | None = None,
) -> Provider:
    """The provider ``name`` from its settings (``--provider-config``); ``revision`` is the
    estate revision the autoscaler runs with (a cloud provider tags its nodes with it)."""
    if name == "local":
        return LocalProvider.from_config(config, url=url, token_file=token_file)
    if name == "ec2":
        from workers.autoscaler.ec2 import Ec2Provider  # boto3 only when it is used

        return Ec2Provider.from_config(config, url=url, token_file=token_file, revision=revision)
    raise ValueError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS)}")
