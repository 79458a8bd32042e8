"""``kliqued ci``: ``init`` writes a ready CI definition for an estate repository;
``comment`` keeps the plan in one pull-request comment (what that definition calls)."""

from __future__ import annotations

import argparse
import json
from importlib import metadata
import os
import sys
from pathlib import Path

from klique_util.cli import HelpFormatter
from klique_util.files import write_atomic
from kliqued.ci import comment, install, workflows

from ._common import add_command


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "ci",
        help="set up CI for an estate repository (plan comment, what-if)",
        description="init writes a GitHub Actions workflow or a GitLab CI job that validates "
        "the estate, plans each pull request with the what-if against the "
        "control plane (the job's own ID token, trusted by the estate: no stored secret), "
        "keeps the plan in "
        "one comment and fails the check on an invalid estate (docs/gitops.md). "
        "comment posts or updates that comment, split when too long.",
        examples="  kliqued ci init github --install "
        "git+https://git.example.org/platform/klique.git@<commit>\n"
        "  kliqued ci init gitlab --estate-path clusters/estate --install "
        "tools/klique-0.1.0-py3-none-any.whl\n"
        "  kliqued ci init github --advise --install "
        "git+https://git.example.org/platform/klique.git@<commit>\n"
        "  kliqued ci init gitlab --advise --install "
        "git+https://git.example.org/platform/klique.git@<commit>\n"
        "  kliqued ci comment github --file plan.md --pr 42",
    )
    sub = p.add_subparsers(dest="ci_command", metavar="<init|comment>")
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])

    i = sub.add_parser(
        "init",
        help="write the CI definition",
        formatter_class=HelpFormatter,
        description="Writes .github/workflows/klique-plan.yml (github) or "
        ".gitlab/klique-plan.gitlab-ci.yml (gitlab) in the "
        "repository; an existing file is kept unless --force.",
    )
    i.add_argument("forge", choices=sorted(workflows.WRITERS))
    i.add_argument(
        "--repo",
        default=".",
        metavar="DIR",
        help="the estate repository's root (default: the current directory)",
    )
    i.add_argument(
        "--estate-path",
        default="estate",
        metavar="PATH",
        help="the estate directory in the repository (default: estate)",
    )
    i.add_argument(
        "--install",
        metavar="SOURCE",
        help="what CI gives pip install, pinned by your organisation: the "
        "project's git URL at a commit (git+https://git.example.org/platform/"
        "klique.git@<commit>) or a wheel (tools/klique-0.1.0-py3-none-any.whl);"
        " never a bare package name (default: the git commit or wheel this "
        "kliqued was installed from, when pip recorded one)",
    )
    i.add_argument(
        "--since",
        default="14d",
        metavar="DURATION",
        help="the what-if's window of real demand (default: 14d)",
    )
    i.add_argument(
        "-o", "--output", metavar="FILE", help="write here instead of the forge's usual place"
    )
    i.add_argument("--force", action="store_true", help="replace an existing file")
    i.add_argument(
        "--advise",
        action="store_true",
        help="write the weekly `kliqued advise` job instead, which opens a pull (GitHub) or "
        "merge (GitLab) request with the changes that would have shortened waits "
        "(docs/advisor.md)",
    )
    i.set_defaults(handler=run_init)

    c = sub.add_parser(
        "comment",
        help="post or update the plan comment of a pull request",
        formatter_class=HelpFormatter,
        description="Finds the plan comments by their hidden marker and edits them in "
        "place; a plan longer than one comment is split into parts (a code block "
        "or folded section cut by a part is closed and reopened), left-over "
        "parts are deleted. GitHub: GITHUB_TOKEN, GITHUB_REPOSITORY, "
        "GITHUB_API_URL and --pr (or the pull request of GITHUB_EVENT_PATH). "
        "GitLab: KLIQUE_BOT_TOKEN, CI_API_V4_URL, CI_PROJECT_ID and "
        "CI_MERGE_REQUEST_IID.",
    )
    c.add_argument("forge", choices=sorted(workflows.WRITERS))
    c.add_argument(
        "--file",
        required=True,
        metavar="FILE",
        help="the plan (kliqued plan --format markdown -o FILE)",
    )
    c.add_argument("--pr", type=int, metavar="N", help="the pull or merge request number")
    c.add_argument(
        "--max-chars",
        type=int,
        default=comment.MAX_CHARS,
        metavar="N",
        help=f"the largest comment (default: {comment.MAX_CHARS:,})",
    )
    c.set_defaults(handler=run_comment)


def run_init(args: argparse.Namespace) -> int:
    rel, make = workflows.WRITERS[args.forge]
    if args.advise:
        rel, make = workflows.ADVISE_WRITERS[args.forge]
    target = Path(args.output) if args.output else Path(args.repo) / rel
    if target.exists() and not args.force:
        print(f"kliqued ci init: {target} exists; --force replaces it", file=sys.stderr)
        return 1
    try:
        pinned = install.parse(args.install) if args.install else _installed_from()
    except install.InstallError as exc:
        print(f"kliqued ci init: {exc}", file=sys.stderr)
        return 2
    if pinned is None:
        print(
            "kliqued ci init: --install is needed: this kliqued was not installed from a git "
            "commit or a wheel that CI can pin (an editable, local or index install); give "
            f"the project's git URL at a commit ({install.EXAMPLES[0]}) or a wheel "
            f"({install.EXAMPLES[1]})",
            file=sys.stderr,
        )
        return 2
    if pinned.kind == "git ref":
        print(
            f"kliqued ci init: note: {pinned.pinned_to!r} is a tag or branch, which can be "
            "moved; a commit hash pins exactly",
            file=sys.stderr,
        )
    text = make(workflows.Options(pinned, args.estate_path.strip("/") or ".", since=args.since))
    write_atomic(target, text)
    print(f"kliqued ci init: wrote {target}", file=sys.stderr)
    return 0


def _installed_from() -> install.Install | None:
    """The pinned source of this kliqued, from pip's PEP 610 record, if it has one."""
    try:
        text = metadata.distribution("klique").read_text("direct_url.json")
        record = json.loads(text) if text else None
    except (metadata.PackageNotFoundError, ValueError):
        return None
    try:
        return install.from_direct_url(record if isinstance(record, dict) else None)
    except install.InstallError:
        return None


def _need(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise comment.CommentError(f"{name} is not set")
    return value


def _github_pr(args: argparse.Namespace) -> int:
    if args.pr is not None:
        return int(args.pr)
    event = os.environ.get("GITHUB_EVENT_PATH")
    if event:
        try:
            data = json.loads(Path(event).read_text(encoding="utf-8"))
            return int(data["pull_request"]["number"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    raise comment.CommentError("no pull request: give --pr (this is not a pull_request run)")


def forge(args: argparse.Namespace) -> comment.Forge:
    if args.forge == "github":
        return comment.GitHub(
            os.environ.get("GITHUB_API_URL") or "https://api.github.com",
            _need("GITHUB_REPOSITORY"),
            _github_pr(args),
            _need("GITHUB_TOKEN"),
        )
    iid = args.pr if args.pr is not None else int(_need("CI_MERGE_REQUEST_IID"))
    return comment.GitLab(
        _need("CI_API_V4_URL"), _need("CI_PROJECT_ID"), iid, _need("KLIQUE_BOT_TOKEN")
    )


def run_comment(args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except OSError as exc:
        print(f"kliqued ci comment: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if args.max_chars < 1000:
        print("kliqued ci comment: --max-chars must be at least 1000", file=sys.stderr)
        return 1
    try:
        done = comment.post(forge(args), text, args.max_chars)
    except (comment.CommentError, ValueError) as exc:
        print(f"kliqued ci comment: {exc}", file=sys.stderr)
        return 1
    print(f"kliqued ci comment: plan comment {done.text}", file=sys.stderr)
    return 0
