"""Reading an estate at a git revision straight from the object database.

No checkout: a plan must not touch the working tree a person is editing, and reading blobs
works the same in a bare CI clone. Every failure is a ``GitSourceError`` with a message a
person can act on; the command prints it and exits 1, never a traceback.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import git
from gitdb.exc import BadName, BadObject

from ..api import YAML_SUFFIXES, SourceFile, read_dir
from ..errors import EstateReadError
from ..errors import GitSourceError as GitSourceError  # noqa: PLC0414 (re-exported)
from .build import Side

DEFAULT_BRANCHES = ("main", "origin/main", "master")
"""Where a feature branch is compared to when no --base is given, first found wins."""

WORKING_TREE = "working tree"


def open_repo(path: str | Path | None = None) -> git.Repo:
    """The repository containing ``path`` (default: the current directory), searching the
    parent directories like git itself does."""
    where = Path(path) if path is not None else Path.cwd()
    try:
        return git.Repo(where, search_parent_directories=True)
    except git.NoSuchPathError:
        raise GitSourceError(f"{where}: no such directory") from None
    except git.InvalidGitRepositoryError:
        raise GitSourceError(
            f"{where.resolve()} is not in a git repository; run inside one or pass --repo DIR"
        ) from None


def repo_dir(repo: git.Repo) -> str:
    return str(repo.working_tree_dir or repo.git_dir)


def resolve(repo: git.Repo, rev: str) -> git.Commit:
    """The commit a revision names (tags peeled); a clear error for anything else."""
    try:
        return repo.commit(rev)  # rev^0: peels annotated tags, rejects trees and blobs
    except (BadName, BadObject, ValueError, IndexError, TypeError, git.GitCommandError):
        raise GitSourceError(f"unknown revision '{rev}' in {repo_dir(repo)}") from None


def default_base(repo: git.Repo, head: git.Commit | None) -> tuple[str, git.Commit]:
    """The merge base of the head (HEAD for the working tree) with the main branch: what a
    pull request would merge into, so the plan shows the branch's own changes only."""
    if head is None:
        try:
            head = repo.head.commit
        except ValueError:
            raise GitSourceError(f"{repo_dir(repo)} has no commits yet; pass --base REV") from None
    for branch in DEFAULT_BRANCHES:
        try:
            target = resolve(repo, branch)
        except GitSourceError:
            continue
        bases = repo.merge_base(head, target)
        if not bases:
            raise GitSourceError(
                f"HEAD and '{branch}' have no common history in {repo_dir(repo)}; pass --base REV"
            )
        return f"merge base with {branch}", bases[0]
    raise GitSourceError(
        f"no branch {', '.join(DEFAULT_BRANCHES)} in {repo_dir(repo)} to "
        "compare with; pass --base REV"
    )


def normalise_estate_path(estate_path: str) -> str:
    p = PurePosixPath(estate_path.replace("\\", "/"))
    parts = [x for x in p.parts if x not in (".", "")]
    if p.is_absolute() or ".." in parts:
        raise GitSourceError(
            f"--estate-path '{estate_path}' must be relative to the repository root, e.g. estate"
        )
    return "/".join(parts)


def files_at(commit: git.Commit, estate_path: str) -> list[SourceFile] | None:
    """Every ``*.yaml``/``*.yml`` blob below ``estate_path`` at ``commit`` (hidden files and
    folders skipped, as ``read_dir`` does), or None when the path does not exist there."""
    tree = commit.tree
    try:
        node = tree / estate_path if estate_path else tree
    except KeyError:
        return None
    if isinstance(node, git.Blob):
        return [SourceFile(estate_path, node.data_stream.read())]
    if not isinstance(node, git.Tree):
        return None  # a submodule
    files = []
    for item in node.traverse():
        if not isinstance(item, git.Blob) or item.mode == 0o120000:  # symlinks: no target
            continue
        rel = (
            PurePosixPath(item.path).relative_to(estate_path)
            if estate_path
            else PurePosixPath(item.path)
        )
        if any(part.startswith(".") for part in rel.parts) or rel.suffix not in YAML_SUFFIXES:
            continue
        files.append(
            SourceFile(f"{estate_path}/{rel}" if estate_path else str(rel), item.data_stream.read())
        )
    return sorted(files, key=lambda f: f.path)


def files_on_disk(repo: git.Repo, estate_path: str) -> list[SourceFile] | None:
    """The working tree's estate, named as in git (``estate/...``), so positions match."""
    if repo.working_tree_dir is None:
        raise GitSourceError(f"{repo.git_dir} is a bare repository: pass --head REV")
    root = Path(repo.working_tree_dir) / estate_path
    if not root.exists():
        return None
    try:
        files = read_dir(root)
    except EstateReadError as exc:
        raise GitSourceError(str(exc)) from None
    if root.is_file():
        return [SourceFile(estate_path, files[0].data)]
    return [
        SourceFile(f"{estate_path}/{Path(f.path).relative_to(root).as_posix()}", f.data)
        for f in files
    ]


def read_sides(
    repo: git.Repo, base: str | None, head: str | None, estate_path: str
) -> tuple[Side, Side]:
    """Both sides of the plan. ``head`` None = the working tree; ``base`` None = the merge
    base of the head with the main branch."""
    estate_path = normalise_estate_path(estate_path)
    head_commit = resolve(repo, head) if head is not None else None
    if base is None:
        base_label, base_commit = default_base(repo, head_commit)
    else:
        base_label, base_commit = base, resolve(repo, base)
    base_side = Side(base_label, base_commit.hexsha, files_at(base_commit, estate_path))
    if head_commit is None:
        head_side = Side(WORKING_TREE, None, files_on_disk(repo, estate_path))
    else:
        head_side = Side(head or "HEAD", head_commit.hexsha, files_at(head_commit, estate_path))
    if base_side.files is None and head_side.files is None:
        raise GitSourceError(
            f"estate path '{estate_path}' exists at neither revision "
            f"({base_side.label}, {head_side.label}); pass --estate-path"
        )
    return base_side, head_side
