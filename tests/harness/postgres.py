"""A real PostgreSQL for the tests: ``initdb`` into a temporary directory, the server started
by its pid on a free port, listening only on a unix socket in that directory, and stopped
(fast shutdown, then SIGKILL) at the end. No mocks: the daemon's PostgreSQL log is tested
against the server it runs against in production.

The binaries are looked for on PATH, then under Debian's ``/usr/lib/postgresql/*/bin``
(``tests/setup/system-packages.sh`` installs the ``postgresql`` package); without them the
tests that need a server skip, saying so. PostgreSQL refuses to run as root: as root, the
server runs as the ``postgres`` user (Debian's package makes it) in a directory it owns.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.harness.daemon import free_port
from tests.harness.typed import present
from tests.harness.wait import wait_for

SUPERUSER = "klique"


def find_bin() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, newest version first."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for d in candidates:
        if (d / "initdb").exists() and (d / "postgres").exists():
            return d
    return None


def unavailable() -> str | None:
    """Why no PostgreSQL can be started here, or None."""
    if find_bin() is None:
        return (
            "PostgreSQL is not installed (no initdb/postgres on PATH or under "
            "/usr/lib/postgresql/*/bin): install Debian's postgresql package "
            "(tests/setup/system-packages.sh) to run the PostgreSQL tests"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return (
                "running as root and there is no 'postgres' user for the server to run "
                "as (PostgreSQL refuses root)"
            )
    return None


class Postgres:
    def __init__(self, prepared_transactions: int = 0, durable: bool = False) -> None:
        """``prepared_transactions``: the server's ``max_prepared_transactions`` (0 is
        PostgreSQL's default, and all kliqued needs; more only for the tests of the batches
        an older kliqued left prepared). ``durable``: PostgreSQL's own defaults
        (every commit flushed to disk), for benchmarks; the tests run without ``fsync``."""
        self.prepared_transactions = prepared_transactions
        self.durable = durable
        bindir = find_bin()
        assert bindir is not None, unavailable()
        self.bin = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="klique-pg-"))  # short: the socket's path
        self.data = self.dir / "data"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            self._user = pwd.getpwnam("postgres")
            os.chown(self.dir, self._user.pw_uid, self._user.pw_gid)

    def _demote(self) -> None:
        if self._user is not None:
            os.setgid(self._user.pw_gid)
            os.setuid(self._user.pw_uid)

    def start(self) -> "Postgres":
        subprocess.run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            check=True,
            capture_output=True,
            preexec_fn=self._demote,
        )
        return self._run()

    def replica(self) -> "Postgres":
        """A streaming replica of this server, started: ``pg_basebackup -R`` (the standby's
        configuration written for it) into a directory of its own, ``postgres`` by its pid on
        another free port. Stop it (``stop``) before this one."""
        standby = Postgres(self.prepared_transactions, self.durable)
        subprocess.run(
            [
                str(self.bin / "pg_basebackup"),
                "-D",
                str(standby.data),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
                "-h",
                str(self.dir),
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
            ],
            check=True,
            capture_output=True,
            preexec_fn=self._demote,
        )
        return standby._run()

    def _run(self) -> "Postgres":
        log = open(self.dir / "server.log", "ab")
        fast = (
            []
            if self.durable
            else ["-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]
        )
        self.proc = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.dir),
                "-c",
                "listen_addresses=",
                *fast,
                "-c",
                f"max_prepared_transactions={self.prepared_transactions}",
            ],
            stdout=log,
            stderr=log,
            preexec_fn=self._demote,
        )
        log.close()
        wait_for(self._ready, 30, "PostgreSQL to accept connections")
        return self

    def wait_replayed(self, primary: "Postgres", timeout: float = 20) -> None:
        """Waits until this replica has replayed what ``primary`` had written when called."""
        import psycopg

        with psycopg.connect(primary.url("postgres"), autocommit=True) as conn:
            lsn = present(conn.execute("SELECT pg_current_wal_lsn()").fetchone())[0]

        def caught_up() -> bool:
            with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
                return bool(
                    present(
                        conn.execute(
                            "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]
                        ).fetchone()
                    )[0]
                )

        wait_for(caught_up, timeout, "the replica to replay the primary's log")

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"postgres exited {self.proc.returncode}:\n{self.log()}")
        import psycopg

        try:
            psycopg.connect(self.url("postgres"), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    def url(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@/{dbname}?host={self.dir}&port={self.port}"

    def createdb(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log(self) -> str:
        try:
            return (self.dir / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def pause(self) -> None:
        """Stops the server (fast shutdown, by its pid) and keeps its data: an outage,
        ended by :meth:`resume` on the same port."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(20)

    def resume(self) -> "Postgres":
        return self._run()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
