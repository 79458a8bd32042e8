"""A stop signal that comes while a standby takes the lease is not lost (found by a fresh
clone's make test: a standby stopped at the moment its leader went away took over and
served on, deaf to the SIGTERM its stop had sent)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from kliqued.daemon.ha import standby
from kliqued.daemon.ha.lease import Lease, LeaseSettings
from kliqued.daemon.listener import Limits
from kliqued.daemon.storage.pglog import PgLog
from kliqued.daemon.storage.store import Store
from tests.harness.daemon import free_port

SHORT = LeaseSettings(ttl_s=0.5, renew_s=0.1)


@pytest.fixture
def lease(pg_url: str, tmp_path: Path):
    store = Store(str(tmp_path / "schema.duckdb"), PgLog(pg_url))
    store.ensure_schema(lead=False)  # the migrations, the lease's table among them
    store.close()
    held = Lease(pg_url, "http://b:1", SHORT)
    yield held
    held.release()
    held.close()
    for sig in standby.STOP_SIGNALS:  # as pytest had them
        signal.signal(sig, signal.SIG_DFL if sig == signal.SIGTERM else signal.default_int_handler)
    standby._stop_asked.clear()


def _stand_by(lease: Lease) -> bool:
    return asyncio.run(standby.stand_by(lease, "127.0.0.1", free_port(), Limits(), None, 16))


def test_a_stop_while_taking_the_lease_is_not_a_takeover(lease: Lease) -> None:
    """The signal lands while the lease is being taken (here: from the step that runs just
    before it is): the standby reports a stop, and the daemon releases the lease."""
    lease.before_takeover = lambda: os.kill(os.getpid(), signal.SIGTERM)
    assert _stand_by(lease) is False
    assert standby.stop_asked()


def test_a_stop_between_the_standby_and_the_leader_is_remembered(lease: Lease) -> None:
    """Taken over, the standby's loop is gone before the leader's starts: a SIGTERM then
    neither kills the daemon outright nor is forgotten; the leader's loop stops at once."""
    assert _stand_by(lease) is True
    assert not standby.stop_asked()
    os.kill(os.getpid(), signal.SIGTERM)
    assert standby.stop_asked()
