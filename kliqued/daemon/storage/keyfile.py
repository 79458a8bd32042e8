"""The daemon's token key (the "pepper" of docs/security.md): 32 random bytes in a 0600 file
beside the database, never inside it.

Stored token and worker-key hashes are HMACs under this key (``ids.TokenHasher``), so a copy of
the database alone (a leaked backup, an SQL read) gives nothing a guess can be checked
against. The file is made at the first start; losing it makes every stored token unusable,
so a start that finds keyed hashes but no key file refuses with a message rather than
silently locking everyone out.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kliqued.daemon.ids import TokenHasher
    from kliqued.daemon.storage.store import Store

KEY_BYTES = 32


class KeyFileError(Exception):
    """The key file is unusable (unreadable, damaged, or missing while keyed hashes exist)."""


def key_path(db: str | Path) -> Path:
    """``<db>.token-key`` beside the database file."""
    db = Path(db)
    return db.with_name(db.name + ".token-key")


def load(path: Path, must_exist: bool) -> bytes:
    """The key from ``path``, made (0600, exclusively) when absent and ``must_exist`` is
    false; a wider mode is narrowed to 0600."""
    if path.exists():
        return _read(path)
    if must_exist:
        raise KeyFileError(
            f"the token key {path} is missing, but the database holds tokens hashed with it: "
            f"restore the file from the backup it was saved with (without it no stored token "
            f"can be checked). To start over with new tokens instead, delete the rows of the "
            f"'tokens' table and start again (a new first admin token is printed)."
        )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # made by someone else just now
        return _read(path)
    except OSError as exc:
        raise KeyFileError(f"cannot create the token key {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(KEY_BYTES) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return _read(path)


def _read(path: Path) -> bytes:
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            os.chmod(path, 0o600)
        text = path.read_text(encoding="ascii").strip()
        key = bytes.fromhex(text)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise KeyFileError(
            f"the token key {path} is unreadable ({exc}): restore it from its backup"
        ) from None
    if len(key) < KEY_BYTES:
        raise KeyFileError(
            f"the token key {path} is {len(key)} bytes; it must hold "
            f"{KEY_BYTES} random bytes as hex: restore it from its backup"
        )
    return key


def missing(db: str | Path, store: "Store") -> str | None:
    """Why a standby could not check the stored tokens if it led now: the database holds
    keyed tokens and the key is not beside ``db`` (never made here: a standby must get the
    leader's key, docs/ha.md). None when it could."""
    from kliqued.daemon.ids import TokenHasher

    path = key_path(db)
    if path.exists() or not any(TokenHasher.is_keyed(r[1]) for r in store.read_tokens()):
        return None
    return (
        f"the token key {path} is missing, but the database holds tokens hashed with "
        f"it: copy it from the leader's machine (it is never in the database)"
    )


def open_hasher(db: str | Path, store: "Store") -> tuple["TokenHasher", int]:
    """The hasher for this database, and how many old unkeyed hashes were converted.

    Databases from before keyed hashes store a bare SHA-256 of each token: they are rewritten
    under the key in one transaction at start (the tokens keep working; nothing to reissue).
    """
    from kliqued.daemon.storage.eventlog import TokenUpdate
    from kliqued.daemon.ids import TokenHasher
    from kliqued.daemon.storage.store import Batch

    rows = store.read_tokens()
    keyed = any(TokenHasher.is_keyed(r[1]) for r in rows)
    hasher = TokenHasher(load(key_path(db), must_exist=keyed))
    legacy = [(r[0], hasher.rekey(r[1])) for r in rows if not TokenHasher.is_keyed(r[1])]
    if legacy:
        store.commit_sync(Batch(ops=[TokenUpdate(tid, "hash", h) for tid, h in legacy]))
    return hasher, len(legacy)
