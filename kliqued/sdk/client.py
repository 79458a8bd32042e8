"""A synchronous client for the kliqued HTTP API (docs/api-contract.md) on the standard library.

    from kliqued.sdk import Client
    k = Client.from_config()                 # --url/--token, KLIQUE_URL/KLIQUE_TOKEN, config
    task = k.submit("llm-research/h100", command=["python", "train.py"], project="rlhf")
    print(task["state"], task["position"], task["waiting_reason"])

Every method returns the server's JSON (dicts and lists) and raises :class:`KliqueError` on
any failure. GETs and requests that are safe to repeat (a submission carries an
``Idempotency-Key``, a fresh one per call unless given; cancel and the engine switch are
idempotent) are retried on connection errors and 503, three times with backoff.

A request body is made by the API's own models (``bodies``, on ``kliqued/api_models``, the
ones the OpenAPI document is generated from), loaded at the first call that sends one: an
argument of the wrong shape is a ``KliqueError`` (``invalid-request``) before any request.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

from klique_util.files import atomic_path, scratch_path, write_atomic
from klique_util.leader import Leader, split_urls

from .config import resolve
from .errors import KliqueError

__all__ = ["Client", "Demand", "KliqueError"]

USER_AGENT = "klique-sdk/0.1"
RETRIES = 3
BACKOFF_S = 0.25


FAILOVER_S = 20.0
"""With several URLs: how long a request keeps looking for the leader (docs/ha.md)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects come back as errors: the client decides where its token goes
    (``klique_util.leader``), urllib never follows one on its own."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _error_code(raw: bytes) -> str | None:
    """The ``error.code`` of a JSON error answer, or None."""
    try:
        return (json.loads(raw.decode("utf-8")).get("error") or {}).get("code")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None


def _read(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read()
    except OSError:
        return b""


def _server_url(url: str) -> str:
    """One server's root URL, checked: ``host:port`` gets ``http://``, a trailing ``/v1``
    goes."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[:-3]
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise KliqueError(
            None,
            "config",
            f"not a server URL: {url!r} (expected http://HOST:PORT or https://HOST:PORT)",
        )
    return url


def _time_text(value: datetime | str) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        text = value.strftime("%Y-%m-%dT%H:%M:%S")
        if value.microsecond:
            text += f".{value.microsecond // 1000:03d}"
        return text + "Z"
    return str(value)


@dataclass(frozen=True)
class Demand:
    """A demand export (``GET /v1/demand``): the CSV and the revision it ran under."""

    text: str
    revision: str
    """The estate revision the daemon runs (``sha256:...``)."""
    commit: str | None
    """The git commit of that revision, when the daemon reads its estate from git."""
    source: str
    """Where it was read."""

    @property
    def tasks(self) -> int:
        return max(0, self.text.count("\n") - 1)


class Client:
    """One server and one token. ``url`` is the server's root (``http://127.0.0.1:8080``)."""

    def __init__(
        self,
        url: str | Sequence[str],
        token: str,
        timeout: float = 30,
        *,
        retries: int = RETRIES,
        backoff_s: float = BACKOFF_S,
        ca_file: str | None = None,
        channel: str = "sdk",
        failover_s: float = FAILOVER_S,
    ) -> None:
        """``url``: one server, or several daemons of one control plane (a list, or
        comma-separated: docs/ha.md); the client follows the leader among them."""
        urls = split_urls(url)
        if not urls:
            raise KliqueError(None, "config", "no server URL given")
        self._leader = Leader([_server_url(u) for u in urls])
        self.failover_s = failover_s
        """With several URLs: how long a request safe to repeat keeps looking for the
        leader (a takeover takes the lease's TTL and a replay)."""
        self.token = (token or "").strip()
        self.timeout = timeout
        self.retries = retries
        self.backoff_s = backoff_s
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._opener = urllib.request.build_opener(
            _NoRedirect, urllib.request.HTTPSHandler(context=self._ssl)
        )
        self.channel = channel
        """Sent as ``X-Klique-Channel`` and recorded with the tasks this client submits:
        ``sdk``, or ``cli`` for the CLI (the daemon refuses any other value)."""

    @classmethod
    def from_config(
        cls,
        url: str | None = None,
        token: str | None = None,
        context: str | None = None,
        timeout: float = 30,
        channel: str = "sdk",
    ) -> "Client":
        """Resolves the URL and token like kubectl (see :mod:`kliqued.sdk.config`)."""
        r = resolve(url, token, context)
        return cls(r.url, r.token, timeout, ca_file=r.ca_file, channel=channel)

    @property
    def url(self) -> str:
        """The server in use: with several URLs, the leader as last found."""
        return self._leader.current

    @property
    def urls(self) -> list[str]:
        return list(self._leader.urls)

    def __repr__(self) -> str:
        return f"Client({','.join(self._leader.urls)!r})"

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a ``ca_file`` (None: the system's trust store), for other
        clients of the same server (``kliqued mcp``'s relay)."""
        return self._ssl

    # ------------------------------------------------------------------ transport
    def _open(
        self,
        method: str,
        path: str,
        query: dict | None = None,
        body: Any = None,
        headers: dict | None = None,
        retry: bool | None = None,
    ):
        """The raw response of one request (the caller closes it), after retries."""
        rel = f"/v1{path}"
        if query:
            pairs = {k: v for k, v in query.items() if v is not None}
            if pairs:
                rel += "?" + urllib.parse.urlencode(pairs)
        data = None if body is None else json.dumps(body).encode("utf-8")
        h = {
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
            "X-Klique-Channel": self.channel,
        }
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        if data is not None:
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        if retry is None:
            retry = method == "GET"
        if self._leader.several:
            return self._open_several(method, path, rel, data, h, retry)
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            req = urllib.request.Request(self.url + rel, data=data, headers=h, method=method)
            try:
                return self._opener.open(req, timeout=self.timeout)
            except urllib.error.HTTPError as exc:
                if exc.code == 503 and not last:
                    exc.close()
                    self._sleep(attempt, exc.headers.get("Retry-After"))
                    continue
                raise self._http_error(exc, method, path) from None
            except (
                urllib.error.URLError,
                http.client.HTTPException,
                ConnectionError,
                socket.timeout,
                TimeoutError,
            ) as exc:
                if not last:
                    self._sleep(attempt)
                    continue
                raise self._unreachable(exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _open_several(
        self, method: str, path: str, rel: str, data: bytes | None, h: dict, retry: bool
    ):
        """:meth:`_open` with several daemons: a redirect (a standby names the leader) and a
        standby's 503 (no leader yet) move on at once, for any request, since nothing was
        recorded; so does a refused connection. A request safe to repeat also moves on after
        a timeout or another 503. All of it within ``failover_s``."""
        deadline = time.monotonic() + self.failover_s
        attempt = 0  # tries that did not reach the leader: a round of the list, then a wait
        while True:
            late = time.monotonic() >= deadline
            req = urllib.request.Request(self.url + rel, data=data, headers=h, method=method)
            try:
                return self._opener.open(req, timeout=self.timeout)
            except urllib.error.HTTPError as exc:
                raw = _read(exc)
                code = _error_code(raw) if exc.code in (307, 308, 503) else None
                attempt += 1
                if exc.code in (307, 308) and not late:
                    self._leader.follow(exc.headers.get("Location"))
                    self._sleep_round(attempt)  # a standby naming a leader that is gone
                    continue
                if exc.code == 503 and not late and (retry or code == "no-leader"):
                    self._leader.next()
                    self._sleep_round(attempt, exc.headers.get("Retry-After"))
                    continue
                raise self._http_error(exc, method, path, raw) from None
            except (
                urllib.error.URLError,
                http.client.HTTPException,
                ConnectionError,
                socket.timeout,
                TimeoutError,
            ) as exc:
                attempt += 1
                refused = isinstance(getattr(exc, "reason", exc), ConnectionRefusedError)
                if not late and (retry or refused):
                    self._leader.next()
                    self._sleep_round(attempt)
                    continue
                raise self._unreachable(exc) from None

    def _sleep_round(self, attempt: int, retry_after: str | None = None) -> None:
        """No wait while URLs of the round are left; then backoff (at most a second, or the
        server's Retry-After up to that)."""
        if attempt % len(self._leader.urls):
            return
        rounds = attempt // len(self._leader.urls)
        delay = min(1.0, self.backoff_s * 2 ** min(rounds - 1, 4))
        if retry_after:
            try:
                delay = max(delay, min(float(retry_after), 1.0))
            except ValueError:
                pass
        time.sleep(delay)

    def _sleep(self, attempt: int, retry_after: str | None = None) -> None:
        delay = self.backoff_s * (2**attempt)
        if retry_after:
            try:
                delay = max(delay, min(float(retry_after), 10.0))
            except ValueError:
                pass
        time.sleep(delay)

    def _unreachable(self, exc: BaseException) -> KliqueError:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLError):
            return KliqueError(
                None,
                "unreachable",
                f"TLS to {self.url} failed ({reason}): check the URL's scheme "
                "(http or https) and the server's certificate (ca-file in the "
                "config context)",
            )
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return KliqueError(
                None,
                "unreachable",
                f"{self.url} did not answer within {self.timeout:g} s: is the "
                "server overloaded, or is the URL right?",
            )
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        return KliqueError(
            None,
            "unreachable",
            f"cannot reach {self.url} ({text}): is `kliqued serve` running "
            "there? Check --url, KLIQUE_URL or the config context",
        )

    def _http_error(
        self, exc: urllib.error.HTTPError, method: str, path: str, raw: bytes | None = None
    ) -> KliqueError:
        """``raw``: the body, when the caller read it already."""
        try:
            raw = exc.read() if raw is None else raw
        except OSError:
            raw = b""
        finally:
            exc.close()
        code, message, details = None, None, None
        try:
            err = json.loads(raw.decode("utf-8")).get("error") or {}
            code, message, details = err.get("code"), err.get("message"), err.get("details")
        except (ValueError, AttributeError, UnicodeDecodeError):
            pass
        if exc.code == 401:
            message = (
                f"{message or 'unauthenticated'}: the server at {self.url} does not "
                "accept this token (check --token, KLIQUE_TOKEN or the config context)"
            )
        if not code:
            code = {401: "unauthenticated", 403: "forbidden", 404: "not-found"}.get(
                exc.code, "http-error"
            )
        if not message:
            snippet = raw[:200].decode("utf-8", "replace").strip()
            message = (
                f"{method} {path}: HTTP {exc.code} {exc.reason}"
                + (f": {snippet}" if snippet else "")
                + (" (is this a kliqued server?)" if exc.code == 404 else "")
            )
        return KliqueError(exc.code, code, message, details)

    def _call(
        self,
        method: str,
        path: str,
        query: dict | None = None,
        body: Any = None,
        headers: dict | None = None,
        retry: bool | None = None,
    ) -> Any:
        with self._open(method, path, query, body, headers, retry) as resp:
            raw = resp.read()
            if not raw:
                return None
            try:
                return json.loads(raw.decode("utf-8"))
            except ValueError:
                raise KliqueError(
                    resp.status,
                    "bad-response",
                    f"{method} {path}: the answer is not JSON (is {self.url} a kliqued server?)",
                ) from None

    @staticmethod
    def _seg(value: str) -> str:
        return urllib.parse.quote(str(value), safe="")

    # ------------------------------------------------------------------ identity, estate
    def health(self) -> dict:
        return self._call("GET", "/health")

    def whoami(self) -> dict:
        return self._call("GET", "/whoami")

    def find_leader(self) -> str:
        """With several URLs: asks the daemon in use which one leads (``GET /v1/leader``, which
        a standby answers itself) and uses the leader when it is one of the URLs; returns
        the URL in use. For a connection made outside this client's requests, which
        follows no redirect: ``kliqued mcp``'s relay. With one URL, nothing is asked."""
        if self._leader.several:
            info = self._call("GET", "/leader")
            self._leader.prefer((info.get("leader") or {}).get("url"))
        return self.url

    def estate(self) -> dict:
        return self._call("GET", "/estate")

    def engine(self) -> dict:
        return self._call("GET", "/engine")

    def plan_state(self) -> dict:
        """The running revision and live counts ``kliqued plan --against`` reads (a
        ``role:planner`` or admin token)."""
        return self._call("GET", "/plan/state")

    def demand(self, since: str | datetime = "14d") -> Demand:
        """The work submitted since ``since`` (a duration back from now such as ``14d``, or a
        time) as a trace CSV, with the revision the daemon runs: what ``kliqued plan
        --what-if-from`` replays (a ``role:planner`` or admin token)."""
        query = {"since": since if isinstance(since, str) else _time_text(since)}
        try:
            with self._open("GET", "/demand", query, headers={"Accept": "text/csv"}) as resp:
                text = resp.read().decode("utf-8")
                revision = resp.headers.get("X-Klique-Revision") or ""
                commit = resp.headers.get("X-Klique-Commit")
        except (OSError, http.client.HTTPException) as exc:
            raise KliqueError(
                None, "unreachable", f"the demand from {self.url} broke off: {exc}"
            ) from None
        return Demand(text, revision, commit, f"{self.url}/v1/demand")

    def demand_export(self, path: str | os.PathLike, since: str | datetime = "14d") -> Demand:
        """:meth:`demand`, written to ``path`` whole or not at all."""
        target = Path(path)
        if target.is_dir() or not target.parent.is_dir():
            raise KliqueError(
                None, "invalid-request", f"{target}: name a file in an existing directory"
            )
        d = self.demand(since)
        write_atomic(target, d.text, mkdir=False)
        return d

    def set_engine(self, enabled: bool) -> dict:
        from .bodies import engine

        return self._call("POST", "/engine", body=engine("set_engine", enabled), retry=True)

    # ------------------------------------------------------------------ tasks
    def submit(
        self,
        resource: str,
        command: Sequence[str] | str | None = None,
        payload: Any = None,
        gpus: float | None = None,
        project: str | None = None,
        labels: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        user: str | None = None,
    ) -> dict:
        """Sends a task to a compute resource (``policy/profile``); returns the Task with its
        state, place in line and waiting reason. A command given as one string is split like a
        shell would. ``user`` is for admins acting on behalf of a user. An argument of the
        wrong shape (``gpus=0.0005``) is refused before any request, as the API would refuse
        it (``invalid-request``, naming the argument)."""
        from .bodies import task

        body = task("submit", resource, command, payload, gpus, project, labels, user)
        key = idempotency_key or str(uuid.uuid4())
        return self._call("POST", "/tasks", body=body, headers={"Idempotency-Key": key}, retry=True)

    def dry_run(
        self,
        resource: str,
        command: Sequence[str] | str | None = None,
        payload: Any = None,
        gpus: float | None = None,
        project: str | None = None,
        labels: dict[str, str] | None = None,
        user: str | None = None,
    ) -> dict:
        """What the engine would do with this task if it were sent now, with nothing stored
        (``POST /v1/tasks`` with ``dry_run: true``): placed (``pool``, ``phase``, the
        ``victims`` it would take GPUs from) or waiting (``waiting_reason``, ``position``),
        the ``budgets`` with it, ``cost_per_hour`` and ``forecast`` (the earliest start the
        estate can know). Refused where ``submit`` would be, with the same error.

        Example: ``Client.from_config().dry_run("llm-research/h100", "python train.py",
        project="rlhf")["outcome"]``."""
        from .bodies import task

        body = task("dry_run", resource, command, payload, gpus, project, labels, user, True)
        return self._call("POST", "/tasks", body=body, retry=True)

    def task(self, id: str) -> dict:
        return self._call("GET", f"/tasks/{self._seg(id)}")

    def tasks(
        self,
        state: str | None = None,
        resource: str | None = None,
        user: str | None = None,
        group: str | None = None,
        page_size: int = 500,
        after: str | None = None,
        newest_first: bool = False,
        **filters: Any,
    ) -> Iterator[dict]:
        """Every task the token may see that matches, across pages (lazily), oldest first
        (``newest_first``: newest first, so the first N are the latest N)."""
        query = {
            "state": state,
            "resource": resource,
            "user": user,
            "group": group,
            "limit": page_size,
            "order": "newest" if newest_first else None,
            **filters,
        }
        while True:
            page = self._call("GET", "/tasks", {**query, "after": after})
            yield from page.get("tasks", [])
            after = page.get("next")
            if not after:
                return

    def task_log(
        self, id: str, offset: int = 0, epoch: int | None = None, limit: int | None = None
    ) -> dict:
        """A task's log (one attempt: ``epoch``, default the latest) from byte ``offset``,
        as uploaded by its worker: ``{"data": bytes, "text", "offset", "next_offset",
        "epoch", "epochs": [1, 2, ...], "size", "complete"}``. ``complete`` is true once no
        more of that attempt will come; read again from ``next_offset`` to follow it."""
        query = {"offset": offset, "epoch": epoch, "limit": limit}
        with self._open(
            "GET", f"/tasks/{self._seg(id)}/log", query, headers={"Accept": "text/plain"}
        ) as resp:
            data = resp.read()
            h = resp.headers
        epochs = [int(e) for e in (h.get("X-Klique-Epochs") or "").split(",") if e.strip()]
        return {
            "data": data,
            "text": data.decode("utf-8", "replace"),
            "offset": offset,
            "next_offset": int(h.get("X-Klique-Next-Offset") or offset + len(data)),
            "epoch": int(h.get("X-Klique-Epoch") or 0),
            "epochs": epochs,
            "size": int(h.get("X-Klique-Log-Size") or 0),
            "complete": h.get("X-Klique-Log-Complete") == "true",
        }

    def cancel(self, id: str, reason: str | None = None) -> dict:
        """Cancels a queued or placed task; cancelling an ended task returns it unchanged.
        ``reason`` is shown to the task's owner (``end.text``: ``cancelled by user:x:
        reason``)."""
        from .bodies import cancel

        body = cancel("cancel", reason)
        return self._call("POST", f"/tasks/{self._seg(id)}/cancel", body=body, retry=True)

    # ------------------------------------------------------------------ schedules
    def create_schedule(
        self,
        cron: str,
        resource: str | None = None,
        command: Sequence[str] | str | None = None,
        *,
        pipeline: str | Path | None = None,
        params: dict[str, str] | None = None,
        timezone: str = "UTC",
        concurrency: str = "allow",
        missed: str = "run-once",
        deadline: str | None = None,
        name: str | None = None,
        project: str | None = None,
        gpus: float | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict:
        """A schedule that sends ``command`` to ``resource`` (or runs the pipeline file
        ``pipeline`` with ``params``) at each time of the 5-field ``cron`` in ``timezone``,
        as the caller. ``concurrency``: allow, forbid or replace a run still going;
        ``missed``: run-once (within ``deadline``, e.g. "2h") or skip the due times the
        daemon was down for. Not retried: a schedule made twice runs twice."""
        from .bodies import schedule

        body = schedule(
            "create_schedule",
            cron,
            resource,
            command,
            pipeline,
            params,
            timezone,
            concurrency,
            missed,
            deadline,
            name,
            project,
            gpus,
            labels,
        )
        return self._call("POST", "/schedules", body=body)

    def schedules(self) -> list[dict]:
        return self._call("GET", "/schedules")["schedules"]

    def schedule(self, id: str) -> dict:
        """One schedule with its next runs and its last runs (each with its task)."""
        return self._call("GET", f"/schedules/{self._seg(id)}")

    def pause_schedule(self, id: str) -> dict:
        return self._call("POST", f"/schedules/{self._seg(id)}/pause", retry=True)

    def resume_schedule(self, id: str) -> dict:
        return self._call("POST", f"/schedules/{self._seg(id)}/resume", retry=True)

    def delete_schedule(self, id: str) -> None:
        self._call("DELETE", f"/schedules/{self._seg(id)}", retry=True)

    # ------------------------------------------------------------------ sessions
    def start_session(
        self,
        resource: str,
        app: str = "jupyter",
        *,
        command: Sequence[str] | None = None,
        project: str | None = None,
        gpus: float | None = None,
        idle: dict[str, str | int] | None = None,
    ) -> dict:
        """Starts an interactive server (``app``: jupyter, vscode or shell; or ``command``, a
        server on 127.0.0.1:$KLIQUE_SESSION_PORT under $KLIQUE_SESSION_PREFIX) on
        ``resource``, reached at the answer's ``url``. ``idle`` lowers the profile's idle
        limits (``{"cpu": "15m"}``, or whole seconds); it cannot raise them. Not retried: two
        calls start two sessions."""
        from .bodies import session

        body = session("start_session", resource, app, command, project, gpus, idle)
        return self._call("POST", "/sessions", body=body)

    def sessions(self) -> list[dict]:
        return self._call("GET", "/sessions")["sessions"]

    def session(self, id: str) -> dict:
        return self._call("GET", f"/sessions/{self._seg(id)}")

    def stop_session(self, id: str) -> dict:
        return self._call("POST", f"/sessions/{self._seg(id)}/stop", retry=True)

    def session_link(self, id: str) -> str:
        """A link that opens the session in a browser: valid once, for two minutes."""
        return self._call("POST", f"/sessions/{self._seg(id)}/link")["url"]

    # ------------------------------------------------------------------ pipelines
    def run_pipeline(
        self,
        path: str | Path,
        params: dict[str, str] | None = None,
        project: str | None = None,
    ) -> dict:
        """Runs the pipeline file at ``path`` (its text is sent, so errors point into it:
        ``file:line:col``); returns the pipeline with its steps. ``project``: the steps'
        project where a step names none (before the file's ``project``). Not retried."""
        from .bodies import pipeline

        body = pipeline("run_pipeline", path, params, project)
        return self._call("POST", "/pipelines", body=body)

    def pipelines(self) -> list[dict]:
        return self._call("GET", "/pipelines")["pipelines"]

    def pipeline(self, id: str) -> dict:
        return self._call("GET", f"/pipelines/{self._seg(id)}")

    def resume_pipeline(self, id: str) -> dict:
        """Resumes a pipeline paused because its token stopped working (its owner only): it
        runs on this client's token from now on."""
        return self._call("POST", f"/pipelines/{self._seg(id)}/resume", retry=True)

    def cancel_pipeline(self, id: str) -> dict:
        return self._call("POST", f"/pipelines/{self._seg(id)}/cancel", retry=True)

    # ------------------------------------------------------------------ resources, policies
    def resources(self) -> list[dict]:
        return self._call("GET", "/resources")["resources"]

    def queue(self, resource: str, limit: int | None = None) -> dict:
        """The queue of a compute resource ``policy/profile``, in order (the first ``limit``
        tasks; ``queued`` is the total)."""
        policy, sep, profile = resource.partition("/")
        if not sep or not policy or not profile:
            raise KliqueError(
                None,
                "invalid-request",
                f"a compute resource is written policy/profile, e.g. "
                f"team-a/standard; found {resource!r}",
            )
        return self._call(
            "GET", f"/resources/{self._seg(policy)}/{self._seg(profile)}/queue", {"limit": limit}
        )

    def policies(self) -> list[dict]:
        return self._call("GET", "/policies")["policies"]

    def policy(self, name: str) -> dict:
        return self._call("GET", f"/policies/{self._seg(name)}")

    def pools(self) -> list[dict]:
        return self._call("GET", "/pools")["pools"]

    def events(
        self,
        task: str | None = None,
        kind: str | None = None,
        since: int = 0,
        page_size: int = 500,
        **filters: Any,
    ) -> Iterator[dict]:
        """The audit log from ``since`` (a sequence number), across pages (lazily)."""
        query = {"task": task, "kind": kind, "limit": page_size, **filters}
        while True:
            page = self._call("GET", "/events", {**query, "since": since})
            yield from page.get("events", [])
            nxt = page.get("next")
            if nxt is None:
                return
            since = nxt

    # ------------------------------------------------------------------ tokens (admin)
    def create_token(
        self,
        user: str | None = None,
        *,
        worker: bool = False,
        pool: str | None = None,
        role: str | None = None,
        name: str | None = None,
        expires_in: str | None = None,
    ) -> dict:
        """A new token for a user, a worker bound to a pool, or a role (``finance``,
        ``admin``); the answer holds the token text, shown only this once. ``expires_in``:
        a duration (``90d``) after which the token stops working. Exactly one of ``user``,
        ``worker`` (with ``pool``) and ``role``."""
        from .bodies import token

        body = token("create_token", user, worker, pool, role, name, expires_in)
        return self._call("POST", "/tokens", body=body)

    def tokens(self) -> list[dict]:
        return self._call("GET", "/tokens")["tokens"]

    def rotate_token(
        self, id: str, grace: str | None = None, expires_in: str | None = None
    ) -> dict:
        """A new secret for token ``id``'s principal; the old one stops at once, or after
        ``grace`` (``1h``). The answer holds the new token, shown only this once."""
        from .bodies import rotation

        body = rotation("rotate_token", grace, expires_in)
        return self._call("POST", f"/tokens/{self._seg(id)}/rotate", body=body)

    def deregister_worker(self, id: str) -> dict | None:
        """Removes worker ``id`` (admins): its tasks go back to their queues. None when the
        control plane does not know it (already gone)."""
        try:
            return self._call("DELETE", f"/workers/{self._seg(id)}")
        except KliqueError as exc:
            if exc.status == 404:
                return None
            raise

    # ------------------------------------------------------------------ cloud (autoscaler)
    def record_cloud_node(
        self, pool: str, node: str, provider: str, instance_type: str, lifecycle: str, gpus: int
    ) -> dict:
        """Records a node the autoscaler started (admins): its interval opens in the ledger
        at its price. Idempotent: the same node again answers it as recorded."""
        from .bodies import cloud_node

        body = cloud_node("record_cloud_node", node, provider, instance_type, lifecycle, gpus)
        return self._call("POST", f"/pools/{self._seg(pool)}/nodes", retry=True, body=body)

    def end_cloud_node(self, pool: str, node: str, reason: str) -> dict | None:
        """Records a node's release (admins); None when the control plane never recorded
        it."""
        try:
            return self._call(
                "DELETE",
                f"/pools/{self._seg(pool)}/nodes/{self._seg(node)}",
                {"reason": reason[:500]},
                retry=True,
            )
        except KliqueError as exc:
            if exc.status == 404:
                return None
            raise

    def autoscaler_heartbeat(self, pool: str, interval_s: float) -> dict:
        """Says that the autoscaler of ``pool`` runs, every ``interval_s`` seconds: an
        autoscaled pool with no live worker takes work only while it does."""
        from .bodies import autoscaler_heartbeat

        body = autoscaler_heartbeat("autoscaler_heartbeat", interval_s)
        return self._call("POST", f"/pools/{self._seg(pool)}/autoscaler", retry=True, body=body)

    def report_scaling(
        self, pool: str, cause: str | None, reason: str | None = None, waiting: int = 0
    ) -> dict:
        """Tells why placed work waits for a node of ``pool`` (``cause``: spend_cap,
        capacity or error), or that it no longer does (None); answers the pool's ``cloud``
        view."""
        from .bodies import scaling

        body = scaling("report_scaling", cause, reason, waiting)
        return self._call("POST", f"/pools/{self._seg(pool)}/scaling", retry=True, body=body)

    def revoke_token(self, id: str) -> None:
        """Revokes a token (idempotent: revoking it again changes nothing)."""
        self._call("DELETE", f"/tokens/{self._seg(id)}", retry=True)

    # ------------------------------------------------------------------ ledger (finance)
    def ledger_sql(self, sql: str, limit: int = 10000) -> dict:
        """Runs one read-only SELECT on the ledger: ``{columns, types, rows, truncated,
        elapsed_ms}``; DECIMALs come back as exact text, times as RFC 3339 UTC. For finance
        and admins; a group admin's query sees their groups' subtrees only."""
        from .bodies import ledger_sql

        body = ledger_sql("ledger_sql", sql, limit)
        return self._call("POST", "/ledger/sql", body=body, retry=True)

    def ledger_export(
        self,
        from_: datetime | str,
        to: datetime | str,
        path: str | os.PathLike,
        format: str = "csv",
    ) -> Path:
        """Writes the ledger rows overlapping [from_, to) to ``path`` as CSV or Parquet. The
        file appears whole or not at all (a temporary file and a rename); Parquet is made
        locally from the server's CSV with an in-memory DuckDB."""
        query = {"from": _time_text(from_), "to": _time_text(to), "format": "csv"}
        return self._download("/ledger/export", query, path, format, "ledger")

    def ledger_focus(self, period: str, path: str | os.PathLike, format: str = "csv") -> Path:
        """Writes one billing period (``2026-11``, a UTC month) of the ledger as a FOCUS 1.2
        dataset to ``path``, CSV or Parquet, whole or not at all. Usage in the period without
        a price is refused (``no-price``, naming the GPU types)."""
        return self._download("/ledger/focus", {"period": period}, path, format, "focus")

    def ledger_statement(self, group: str, period: str, format: str = "json") -> Any:
        """The chargeback statement of ``group``'s subtree (a team, a department or a
        business unit) for the month ``period`` (``2026-11``): a dict (``format="json"``:
        ``lines``, ``total``, ``budgets``...; amounts as exact decimal text), or the CSV or
        printable HTML text. An unknown group is ``not-found``."""
        if format not in ("json", "csv", "html"):
            raise KliqueError(
                None, "invalid-request", f"format must be json, csv or html, found {format!r}"
            )
        query = {"group": group, "period": period, "format": format}
        if format == "json":
            return self._call("GET", "/ledger/statement", query, retry=True)
        with self._open("GET", "/ledger/statement", query, retry=True) as resp:
            return resp.read().decode("utf-8")

    def ledger_feed(self, cursor: str | None = None, limit: int = 1000) -> dict:
        """One pull of the billing feed: closed intervals after ``cursor`` (None: from the
        start) in the order they closed, ``{columns, rows, cursor, more}``. Keep the
        answer's ``cursor`` (durably, with what you stored of the rows) and pass it to the
        next pull: no row comes twice and none is missed, across daemon restarts."""
        return self._call("GET", "/ledger/feed", {"cursor": cursor, "limit": limit}, retry=True)

    def ledger_partitions(self, periods: list[str], directory: str | os.PathLike) -> list[Path]:
        """Writes each month of ``periods`` (``2026-11``...) as FOCUS Parquet into
        ``directory/month=YYYY-MM/focus.parquet`` (Hive-style partitions that DuckDB, Spark
        and Trino read as a table with a ``month`` column), replacing that month's file
        whole. The directory and the month directories are created as needed, as an
        exporter's output file is."""
        root = Path(directory)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KliqueError(
                None,
                "invalid-request",
                f"cannot create the directory {root}: {exc.strerror or exc}",
            ) from None
        written = []
        for period in periods:
            part = root / f"month={period}"
            part.mkdir(exist_ok=True)
            written.append(self.ledger_focus(period, part / "focus.parquet", format="parquet"))
        return written

    def ledger_cio(self, period: str) -> dict:
        """The CIO's figures for the month ``period`` (``2026-11``): ``estate_use`` (per
        pool), ``business_units``, ``idle`` (who pays for idle capacity), ``lending`` (who
        borrowed beyond their reservation and whose idle reservation lent it) and
        ``in_use_now`` (docs/ledger.md)."""
        return self._call("GET", "/ledger/cio", {"period": period}, retry=True)

    def _download(
        self, endpoint: str, query: dict, path: str | os.PathLike, format: str, columns: str
    ) -> Path:
        """Streams the CSV of ``endpoint`` into ``path``, converted to Parquet with the
        column types of ``columns`` (``ledger`` or ``focus``) when ``format`` says so."""
        if format not in ("csv", "parquet"):
            raise KliqueError(
                None, "invalid-request", f"format must be csv or parquet, found {format!r}"
            )
        target = Path(path)
        if target.is_dir():
            raise KliqueError(
                None, "invalid-request", f"{target} is a directory: name the file to write"
            )
        if not target.parent.is_dir():
            raise KliqueError(
                None,
                "invalid-request",
                f"the directory {target.parent} does not exist: create it first "
                "(an export never creates directories)",
            )
        # CSV: downloaded next to the target and renamed over it; Parquet: the CSV is a
        # scratch file next to the target, converted (atomically) into it
        place = atomic_path if format == "csv" else scratch_path
        started = False
        try:
            with place(target, suffix=".csv") as tmp:
                started = True
                with (
                    open(tmp, "wb") as out,
                    self._open("GET", endpoint, query, headers={"Accept": "text/csv"}) as resp,
                ):
                    while True:
                        chunk = resp.read(1 << 16)
                        if not chunk:
                            break
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                if format == "parquet":
                    from kliqued.ledger.export import csv_to_parquet, parquet_columns

                    csv_to_parquet(tmp, target, parquet_columns(columns))
        except OSError as exc:
            if not started:
                raise KliqueError(
                    None, "invalid-request", f"cannot write in {target.parent}: {exc.strerror}"
                ) from None
            raise KliqueError(
                None, "unreachable", f"the export from {self.url} broke off: {exc}"
            ) from None
        except http.client.HTTPException as exc:
            raise KliqueError(
                None, "unreachable", f"the export from {self.url} broke off: {exc}"
            ) from None
        return target
