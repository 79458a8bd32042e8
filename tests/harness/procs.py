"""Process checks the tests share."""

from __future__ import annotations


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (exited orphans linger as zombies here for a second or two)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:  # no such pid, or gone between open and read (ProcessLookupError)
        return False
