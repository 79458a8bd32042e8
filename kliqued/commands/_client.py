"""What the user commands (submit, status, queue, cancel, budget, pools, ledger) share: the
connection flags, one SDK client, errors as one line, and plain-text tables."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from klique_util.leader import split_urls
from klique_util.units import DAY_S, HOUR_S, MINUTE_S

if TYPE_CHECKING:
    from kliqued.sdk import Client


SEVERAL_URLS = (
    "several daemons of one control plane: repeat it, or separate them with "
    "commas, and the leader is followed"
)
"""The help every flag naming the control plane ends with (``--url``, ``plan --against``,
``plan --what-if-from``, ``workers rollout --url``): one wording, one parsing (:func:`urls`)."""


def urls(values: str | list[str] | None) -> str | None:
    """A repeated or comma-separated URL flag as the SDK takes it (``"a,b"``: every URL
    once, in order; ``klique_util.leader.split_urls``); None when none was given."""
    listed = split_urls(values)
    return ",".join(listed) if listed else None


def ci_token(token: str | None, aud: str | None) -> str | None:
    """The token a CI-run command (``plan --against``, ``plan --what-if-from``, ``advise
    --against``) sends: ``--token``, else ``KLIQUE_TOKEN``, else the CI job's own ID token
    (GitHub Actions' ``id-token: write``, GitLab's ``id_tokens``: no stored secret), else
    None (``Client.from_config`` then reads the config context's)."""
    import os

    from kliqued.sdk.config import ENV_TOKEN
    from kliqued.sdk.workload import job_id_token

    if token or os.environ.get(ENV_TOKEN):
        return token or os.environ[ENV_TOKEN]
    return job_id_token(aud)


def add_client_flags(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    """--url, --token, --context (and --json) on a user command."""
    g = p.add_argument_group("connection")
    g.add_argument(
        "--url",
        metavar="URL",
        action="append",
        help="the server, e.g. http://127.0.0.1:8080 (default: KLIQUE_URL or the "
        f"config context); {SEVERAL_URLS}",
    )
    g.add_argument(
        "--token",
        metavar="TOKEN",
        help="the API token (default: KLIQUE_TOKEN or the config context)",
    )
    g.add_argument(
        "--context",
        metavar="NAME",
        help="a context of the config file instead of its current-context",
    )
    g.add_argument(
        "--timeout",
        metavar="S",
        type=float,
        default=30.0,
        help="seconds to wait for an answer (default: 30)",
    )
    if json_flag:
        p.add_argument("--json", action="store_true", help="print the server's JSON")


def client(args: argparse.Namespace) -> Client:
    """The SDK's client for the command's flags, declaring the ``cli`` channel: the tasks
    the CLI submits are recorded as sent through it. The SDK (``http.client``, ``ssl``,
    ``email``: a third of ``kliqued whoami --help``'s start) is imported here, when a
    command runs, not when its parser is built (tests/cli/test_lazy.py)."""
    from kliqued.sdk.client import Client

    return Client.from_config(
        url=urls(args.url),
        token=args.token,
        context=args.context,
        timeout=args.timeout,
        channel="cli",
    )


def fail(message: str) -> int:
    print(f"kliqued: {message}", file=sys.stderr)
    return 1


def handles_errors(fn: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """Turns any SDK or file error into ``kliqued: <message>`` and exit 1, never a
    traceback."""

    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        from kliqued.sdk.errors import KliqueError  # light: no HTTP stack

        try:
            return fn(args)
        except KliqueError as exc:
            return fail(exc.message)
        except BrokenPipeError:
            raise  # the reader of stdout went away: kliqued.cli stops quietly
        except OSError as exc:
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            return fail(f"{exc.strerror or exc}{':' if where else ''}{where}")

    return run


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Iterable[int] = ()) -> str:
    """A plain-text table: a header, columns padded to their widest cell, numbers in the
    ``right`` columns right-aligned."""
    cells = [[cell(v) for v in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, v in enumerate(r):
            widths[i] = max(widths[i], len(v))
    right = set(right)

    def line(values: Sequence[str]) -> str:
        out = [
            v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(list(headers))] + [line(r) for r in cells])


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return num(value)
    return str(value)


def num(value: Any) -> str:
    """A GPU amount (exact thousandths): 12.0 -> '12', 0.25 -> '0.25', 1.125 -> '1.125';
    never '-0'. Hours and costs go through :func:`klique_util.fmt.hours` instead."""
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value
    text = f"{float(value):.3f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def when(text: str | None, now: datetime | None = None) -> str:
    """An RFC 3339 time as `2026-11-29 09:02:17Z (3m ago)` / `(in 2h)`."""
    if not text:
        return "-"
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    now = now or datetime.now(timezone.utc)
    delta = (t - now).total_seconds()
    rel = ago(abs(delta))
    return f"{t.strftime('%Y-%m-%d %H:%M:%S')}Z ({'in ' + rel if delta > 0 else rel + ' ago'})"


def ago(seconds: float) -> str:
    for size, unit in ((DAY_S, "d"), (HOUR_S, "h"), (MINUTE_S, "m")):
        if seconds >= size:
            return (
                f"{seconds / size:.0f}{unit}"
                if seconds < size * 10
                else f"{seconds // size:.0f}{unit}"
            )
    return f"{seconds:.0f}s"


def reason(value: dict | None) -> str:
    if not value:
        return "-"
    return value.get("text") or value.get("kind") or "-"
