"""Old import path of the daemon harness, kept so that tests written against it still work:
the one implementation is tests/harness/daemon.py (and waiting is tests/harness/wait.py)."""

from tests.harness.daemon import ADMIN, EXAMPLE_ESTATE, ROOT, SMALL_ESTATE, Server, free_port
from tests.harness.wait import wait_for

__all__ = ["ADMIN", "EXAMPLE_ESTATE", "ROOT", "SMALL_ESTATE", "Server", "free_port", "wait_for"]
