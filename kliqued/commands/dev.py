"""``kliqued dev``: the whole product on one machine (what ``make run`` starts).

It starts ``kliqued serve`` on the estate (watched: edits apply live) with a local DuckDB
file, creates a token for every user of the estate through the API with the admin token
(``run/tokens/<user>.token``), starts a local ``klique-worker`` for the bare-metal pool
(process executor, declared GPUs), prints the URL and ready-to-use ``export`` lines, and
stays in the foreground until Ctrl-C, which stops the worker, then the daemon. Running it
again reuses the database, the tokens and the worker's state: nothing is lost.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from klique_util import session_apps

from ._common import add_command
from .devworkers import dev_workers

DEFAULT_POOL = "onprem-baremetal"
SHOWN_USERS = ("alice", "heidi", "zoe")
"""Whose export lines are printed (alice: llm-research, whose l40s-1x profile lists the
bare-metal pool the local worker serves first; heidi and zoe: groups with cpu-only)."""
SIGN_IN_TTL = "12h"
"""The dashboard sign-in token printed at start expires after this (a working day), so the
one token that appears on the terminal is short-lived; the token files last."""


def register(subparsers) -> None:
    p = add_command(
        subparsers,
        "dev",
        help="run the control plane and a local worker (make run)",
        description="Starts kliqued serve on the estate (watched) with a database in "
        "--dir, a token per user of the estate in DIR/tokens/, and a local "
        "klique-worker for a pool (process executor: commands run as processes "
        "on this machine, with declared GPUs unless --gpus auto). Prints the URL "
        "and export lines for the users, then stays in the foreground: Ctrl-C "
        "stops the worker and the daemon cleanly. Logs: DIR/kliqued.log, "
        "DIR/worker-<pool>.log; the URL is in DIR/url (port 8080, or the next "
        "free one, said when 8080 is taken). One kliqued dev per --dir: a second "
        "one stops at once, naming the first (DIR/dev.lock).",
        examples="  kliqued dev                                   # what make run does\n"
        "  kliqued dev --listen 127.0.0.1:9090 --dir /tmp/klique\n"
        "  kliqued dev --pool onprem-baremetal --pool onprem-k8s   # two local workers\n"
        "  # then, in another terminal, as alice (group llm-research):\n"
        "  export KLIQUE_URL=$(cat run/url) KLIQUE_TOKEN=$(cat run/tokens/alice.token)\n"
        "  kliqued submit --resource llm-research/l40s-1x -p evals -- \\\n"
        "      python -c \"print('hello')\"\n"
        "  kliqued logs t-01M8K8MWK70000",
    )
    p.add_argument(
        "--estate",
        metavar="DIR",
        default="estate",
        help="the estate directory (default: %(default)s)",
    )
    p.add_argument(
        "--dir",
        metavar="DIR",
        default="run",
        help="database, tokens, logs and worker state (default: %(default)s)",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=None,
        help="where the API listens (default: 127.0.0.1:8080, or the next free port)",
    )
    p.add_argument(
        "--sessions-listen",
        metavar="HOST:PORT",
        default=None,
        help="where interactive sessions are served, an origin of its own (default: the "
        "API's port + 1, or the next free port)",
    )
    p.add_argument(
        "--pool",
        action="append",
        default=None,
        metavar="NAME",
        help=f"run a local worker for this pool (repeatable; default: {DEFAULT_POOL})",
    )
    p.add_argument(
        "--gpus",
        default=None,
        metavar="LIST",
        help="the worker's GPUs: auto (nvidia-smi), 0,1,2,3, or none (default: "
        "as many declared GPUs as the pool's capacity)",
    )
    p.add_argument("--no-worker", action="store_true", help="start no worker")
    p.add_argument(
        "--grace",
        default="10s",
        metavar="DURATION",
        help="SIGTERM to SIGKILL for a stopped task (default: %(default)s)",
    )
    p.set_defaults(handler=run)


def _free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


DEFAULT_PORT = 8080


def _listen(arg: str | None, first: int = DEFAULT_PORT) -> tuple[str, str | None]:
    """Where to listen, and a note when it is not the default: ``first`` taken (another
    kliqued dev, or anything else) is said out loud, since the README's and a colleague's
    ``KLIQUE_URL`` say 8080 (issue 10, bug 13)."""
    if arg:
        return arg, None
    for port in range(first, first + 20):
        if _free("127.0.0.1", port):
            break
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    if port == first:
        return f"127.0.0.1:{port}", None
    return f"127.0.0.1:{port}", (
        f"port {first} is in use: listening on 127.0.0.1:{port} "
        "instead (the export lines below say so)"
    )


def _sessions_listen(listen: str) -> str:
    """The sessions' listener beside the API: the API's port + 1 (8081), or the next free
    one: a port of its own is an origin of its own (docs/decisions.md, sessions)."""
    host, _, port = listen.rpartition(":")
    host = host or "127.0.0.1"
    for candidate in range(int(port) + 1, int(port) + 21):
        if candidate <= 65535 and _free(host.strip("[]"), candidate):
            return f"{host}:{candidate}"
    return f"{host}:0"


class AlreadyRunning(Exception):
    """Another kliqued dev holds the directory."""


def _hold(home: Path) -> Any:
    """Takes DIR/dev.lock (an exclusive flock, released by the kernel however this process
    ends) before anything in DIR is touched: a second ``kliqued dev`` on the same directory
    stops here, instead of starting a daemon that fails on the locked database and writes
    its error into the running daemon's log. The lock file holds the holder's pid and URL
    for that message."""
    home.mkdir(parents=True, exist_ok=True)
    fh = open(home / "dev.lock", "a+")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise AlreadyRunning(holder) from None
    return fh


def _note_holder(fh: Any, url: str) -> None:
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}, {url}\n")
    fh.flush()


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")
    os.chmod(path, 0o600)


def _token_ok(url: str, token: str) -> bool:
    from kliqued.sdk import Client, KliqueError

    try:
        Client(url, token, timeout=5, retries=0).whoami()
        return True
    except KliqueError:
        return False


def _token(url: str, admin, path: Path, **kind) -> str:
    """The token in ``path`` if the server still accepts it, else a new one."""
    if path.exists():
        old = path.read_text().strip()
        if old and _token_ok(url, old):
            return old
    made = admin.create_token(name="kliqued dev", **kind)["token"]
    _write_secret(path, made)
    return made


def _stop(proc: subprocess.Popen | None, what: str, timeout: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        print(
            f"kliqued dev: {what} did not stop within {timeout:.0f} s: killing it", file=sys.stderr
        )
        proc.kill()
        proc.wait(5)


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run(args: argparse.Namespace) -> int:
    from klique_util.filemodes import private_dir, private_umask

    private_umask()  # tokens, the database, logs; inherited by the daemon and the workers
    home = Path(args.dir)
    tokens = home / "tokens"
    private_dir(home)
    try:
        lock = _hold(home)
    except AlreadyRunning as exc:
        print(
            f"kliqued dev: already running in {home}/ ({exc}): use that one, stop it "
            "(Ctrl-C in its terminal), or give another --dir",
            file=sys.stderr,
        )
        return 1
    try:
        return _run(args, home, tokens, lock)
    finally:
        lock.close()


def _run(args: argparse.Namespace, home: Path, tokens: Path, lock: Any) -> int:
    from compiler.api import compile_dir
    from kliqued.daemon.ids import new_token
    from kliqued.sdk import Client, KliqueError

    from klique_util.filemodes import original_umask, private_dir

    private_dir(tokens)
    result = compile_dir(args.estate)
    if result.estate is None:
        for d in result.errors:
            print(d.render(), file=sys.stderr)
        print(f"kliqued dev: the estate in {args.estate} is not valid", file=sys.stderr)
        return 2
    estate = result.estate
    pools = args.pool or ([] if args.no_worker else [DEFAULT_POOL])
    if args.no_worker:
        pools = []
    for pool in pools:
        if estate.pool(pool) is None:
            print(f"kliqued dev: no pool {pool!r} in {args.estate}", file=sys.stderr)
            return 2
    listen, note = _listen(args.listen)
    url = f"http://{listen}"
    if note:
        print(f"kliqued dev: {note}", file=sys.stderr, flush=True)
    _note_holder(lock, url)
    (home / "url").write_text(url + "\n")
    admin_file = tokens / "admin.token"
    admin_token = admin_file.read_text().strip() if admin_file.exists() else ""
    if not admin_token:
        admin_token = new_token()
        _write_secret(admin_file, admin_token)
    env = {**os.environ, "KLIQUE_ADMIN_TOKEN": admin_token}
    daemon_log = home / "kliqued.log"
    procs: list[tuple[str, subprocess.Popen, Path]] = []
    stopping = False

    def on_signal(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    serve = None
    try:
        with open(daemon_log, "a") as fh:
            serve = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kliqued.cli",
                    "serve",
                    "--estate",
                    args.estate,
                    "--db",
                    str(home / "kliqued.duckdb"),
                    "--listen",
                    listen,
                    "--sessions-listen",
                    args.sessions_listen or _sessions_listen(listen),
                ],
                env=env,
                stdout=fh,
                stderr=fh,
                start_new_session=True,
                umask=original_umask(),
            )  # each sets 077 itself; tasks get the original
        procs.append(("kliqued serve", serve, daemon_log))
        admin = Client(url, admin_token, timeout=10, retries=0)
        deadline = time.monotonic() + 60
        while True:
            if serve.poll() is not None:
                print(
                    f"kliqued dev: kliqued serve exited ({serve.returncode}):\n{_tail(daemon_log)}",
                    file=sys.stderr,
                )
                return 1
            try:
                if admin.health().get("status") == "ok":
                    break
            except KliqueError:
                pass
            if time.monotonic() > deadline or stopping:
                print(
                    f"kliqued dev: kliqued serve did not come up:\n{_tail(daemon_log)}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.1)
        users = sorted({u for g in estate.groups for u in (*g.users, *g.admins)})
        user_tokens = {}
        for u in users:
            safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in u)
            user_tokens[u] = _token(url, admin, tokens / f"{safe}.token", user=u)
        _token(url, admin, tokens / "finance.token", role="finance")
        for pool in pools:
            tfile = tokens / f"worker-{pool}.token"
            _token(url, admin, tfile, worker=True, pool=pool)
            cpool = estate.pool(pool)
            if cpool is None:  # checked above
                continue
            # one worker per declared machine (devworkers.py): no capacity warning
            for dw in dev_workers(cpool, args.gpus):
                wlog = home / f"worker-{dw.name}.log"
                with open(wlog, "a") as fh:
                    w = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "workers.cli",
                            "--url",
                            url,
                            "--pool",
                            pool,
                            "--token-file",
                            str(tfile),
                            "--state-dir",
                            str(home / f"worker-{dw.name}"),
                            "--gpus",
                            dw.gpus,
                            "--grace",
                            args.grace,
                        ],
                        stdout=fh,
                        stderr=fh,
                        start_new_session=True,
                        umask=original_umask(),
                    )
                procs.append((f"klique-worker ({dw.name})", w, wlog))
        _wait_for_workers(admin, pools, procs, lambda: stopping)
        signer = next((u for u in SHOWN_USERS if u in user_tokens), None)
        sign_in = (
            None
            if signer is None
            else (
                signer,
                admin.create_token(
                    signer, name="dashboard sign-in (kliqued dev)", expires_in=SIGN_IN_TTL
                )["token"],
            )
        )
        print(banner(url, args, estate, home, pools, user_tokens, sign_in), flush=True)
        while not stopping:
            for what, proc, logf in procs:
                if proc.poll() is not None:
                    print(
                        f"kliqued dev: {what} exited ({proc.returncode}); stopping. Its "
                        f"log ({logf}):\n{_tail(logf)}",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.2)
        print("\nkliqued dev: stopping the worker, then the daemon ...", flush=True)
        return 0
    finally:
        for what, proc, _ in reversed(procs):  # workers first, the daemon last
            _stop(proc, what, 25 if proc is serve else 15)
        for s, h in old.items():
            signal.signal(s, h)
        if stopping:
            print(
                "kliqued dev: stopped (a task still running keeps running; the next "
                "kliqued dev takes it back)",
                flush=True,
            )


def _wait_for_workers(admin, pools: list[str], procs: list, stopping) -> None:
    """Until every started worker has registered (a pool with no live worker takes no work,
    so "running" is said once work can run), 60 s at most; a worker that exits is reported
    by the caller's loop."""
    from kliqued.sdk import KliqueError

    deadline = time.monotonic() + 60
    while not stopping() and time.monotonic() < deadline:
        if any(proc.poll() is not None for _, proc, _ in procs):
            return
        try:
            live = {p["name"] for p in admin.pools() if (p.get("workers") or {}).get("live")}
        except KliqueError:
            live = set()
        if live >= set(pools):
            return
        time.sleep(0.1)


def session_lines(rel: str, path: str | None = None) -> list[str]:
    """What ``make run`` says of sessions: the apps its workers can start (their tasks' PATH:
    this virtual env's ``bin`` first, as the process executor sets it) and how to enable the
    others. ``make run`` installs none (JupyterLab is some 100 MB of packages: the first run
    stays fast; docs/decisions.md, issue 32)."""
    bindir = os.path.dirname(sys.executable)
    found = session_apps.detect(
        path if path is not None else f"{bindir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    )
    out = [
        "Sessions (kliqued session start --app APP): the workers can start "
        + (", ".join(found) if found else "none of jupyter, vscode, shell")
        + "."
    ]
    if "jupyter" not in found:
        out.append(
            f"  JupyterLab: {os.path.join(bindir, 'pip')} install jupyterlab, then make run again"
        )
    if found:
        app = "jupyter" if "jupyter" in found else found[0]
        out.append(
            f"  {rel} session start --resource llm-research/l40s-1x --project evals --app {app}"
        )
    for app in ("vscode", "shell"):
        if app not in found:
            out.append(f"  {app}: {session_apps.enable_hint(app)}")
    return out + [""]


def banner(
    url: str,
    args: argparse.Namespace,
    estate,
    home: Path,
    pools: list[str],
    user_tokens: dict[str, str],
    sign_in: tuple[str, str] | None = None,
) -> str:
    """What ``make run`` prints. Of the tokens, only the dashboard's sign-in token appears
    (a scrollback or a screen share would show it), and it expires in ``SIGN_IN_TTL``: each
    export line reads its 0600 file."""
    line = "-" * 78
    kq = f"{sys.executable.rsplit('/', 1)[0]}/kliqued"
    rel = os.path.relpath(kq) if kq.startswith(os.getcwd()) else kq
    tokens = home / "tokens"
    out = [
        line,
        f"Klique is running at {url}   (estate {args.estate}/, watched; "
        f"revision {estate.revision[:19]})",
        "",
    ]
    for pool in pools:
        ws = dev_workers(estate.pool(pool), args.gpus)
        sizes = "+".join(str(len(w.gpus.split(","))) for w in ws)
        what = (
            args.gpus
            if args.gpus
            else f"{sizes} declared GPUs"
            if len(ws) == 1
            else f"{len(ws)} workers, one per declared machine ({sizes} declared GPUs)"
        )
        logs = (
            f"{home}/worker-{ws[0].name}.log" if len(ws) == 1 else f"{home}/worker-{pool}-<n>.log"
        )
        out.append(f"  worker   {pool}: {what}, process executor, log {logs}")
    out += [
        f"  daemon   log {home}/kliqued.log, database {home}/kliqued.duckdb, URL in {home}/url",
        f"  tokens   {tokens}/<user>.token for every user of the estate "
        f"({len(user_tokens)}), admin.token, finance.token (each readable by you only)",
        "",
        "In another terminal, as one of the example users:",
        "",
    ]
    for u in SHOWN_USERS:
        if u in user_tokens:
            groups = [g.name for g in estate.groups if u in g.users]
            out.append(f"  # {u} ({', '.join(groups) or 'admin'})")
            out.append(f"  export KLIQUE_URL={url} KLIQUE_TOKEN=$(cat {tokens}/{u}.token)")
    out += [
        "  # the platform admin",
        f"  export KLIQUE_URL={url} KLIQUE_TOKEN=$(cat {tokens}/admin.token)",
        "",
        "Then, as alice (llm-research/l40s-1x: one GPU, bare-metal pool first):",
        "",
        f"  {rel} resources          # what you may submit to, and your group's room",
        f"  {rel} submit --resource llm-research/l40s-1x --project evals -- "
        "python -c \"print('hello')\"",
        f"  {rel} status <ID>        # running, then ended (finished), GPU-hours",
        f"  {rel} logs <ID>          # hello",
        "",
        *session_lines(rel),
        "Ctrl-C stops the worker and the daemon.",
        line,
    ]
    if sign_in is not None:
        who, token = sign_in
        out[3:3] = [
            f"  Dashboard  {url}/  sign in as {who} with the token below (it expires "
            f"in {SIGN_IN_TTL}),",
            f"             or as anyone else with their file in {tokens}/",
            f"  sign-in token: {token}",
            "",
        ]
    return "\n".join(out)
