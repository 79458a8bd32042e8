"""The worker's HTTP client for the control plane (docs/worker-protocol.md).

Outbound only, aiohttp, TLS verified by default (``ca_file`` for a private CA). Errors come
in three kinds, which the daemon treats differently:

- ``Unreachable``: the control plane could not answer (connection refused, timeout, 5xx,
  429, 401 while a token is being rotated): wait and retry, never give up;
- ``StaleEpoch``: ``409 stale-epoch``: fencing, the task must be stopped at once;
- ``ApiError``: any other refusal (400, 403, 404, 409 conflict, ...): retrying cannot help.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp

from klique_util.leader import Leader, split_urls
from workers import __version__
from workers.errors import ApiError, ConfigError, StaleEpoch, Unreachable

LOG_CHUNK = 256 * 1024
WORKER_KEY_HEADER = "X-Klique-Worker-Key"


def base_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    return url + "/v1"


class TokenFile:
    """Reads the token file again when it changes, so a rotated token is picked up."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self._mtime: float | None = None
        self._token = ""
        self.read()

    def read(self) -> str:
        st = self.path.stat()
        if st.st_mtime != self._mtime:
            token = self.path.read_text(encoding="utf-8").strip()
            if not token:
                raise ConfigError(f"the token file {self.path} is empty")
            self._token, self._mtime = token, st.st_mtime
        return self._token

    def get(self) -> str:
        try:
            return self.read()
        except (OSError, ValueError):
            return self._token  # keep the last good one


class ControlPlaneClient:
    def __init__(self, url: str | list[str], token_file: str | Path, ca_file: str | None = None):
        """``url``: the control plane, or several daemons of it (a list, or
        comma-separated): the worker follows the leader (``klique_util.leader``)."""
        urls = split_urls(url)
        if not urls:
            raise ConfigError("no control-plane URL given (--url)")
        self.leader = Leader(urls)
        self.token = TokenFile(token_file)
        self.ca_file = ca_file
        self.worker_key: str | None = None
        """Sent on every call (``X-Klique-Worker-Key``): proves which worker of the pool
        this is (the token is the pool's). Set from the state dir (StateDir.worker_key)."""
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        if self.ca_file:
            return ssl.create_default_context(cafile=self.ca_file)
        return True

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl(), limit=16),
                headers={"User-Agent": f"klique-worker/{__version__}"},
            )
        return self._session

    @property
    def base(self) -> str:
        """The API root of the daemon in use (``.../v1``)."""
        return base_url(self.leader.current)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def auth_headers(self) -> dict[str, str]:
        """What every call carries: the pool's token and this worker's key."""
        headers = {"Authorization": f"Bearer {self.token.get()}"}
        if self.worker_key:
            headers[WORKER_KEY_HEADER] = self.worker_key
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        params: dict | None = None,
        timeout_s: float = 30,
    ) -> Any:
        session = await self.session()
        headers = self.auth_headers()
        if data is not None:
            headers["Content-Type"] = "application/octet-stream"
        for _ in self.leader.urls:  # a standby's redirect: at once to the leader
            try:
                async with session.request(
                    method,
                    self.base + path,
                    json=json_body,
                    data=data,
                    params=params,
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                ) as resp:
                    body = await resp.read()
                    status = resp.status
                    location = resp.headers.get("Location")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                self.leader.next()  # the next daemon at the daemon's retry
                raise Unreachable(
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                ) from exc
            if status not in (307, 308):
                break
            self.leader.follow(location)
        if status in (307, 308) or (status == 503 and self.leader.several):
            self.leader.next()  # a standby, or a leader going away: the next at the retry
            raise Unreachable(
                f"{method} {path}: {status}: {body[:200]!r} (trying {self.leader.current} next)"
            )
        if 200 <= status < 300:
            if not body:
                return {}
            try:
                return json.loads(body)
            except ValueError as exc:
                raise Unreachable(f"{method} {path}: answer is not JSON") from exc
        code, message = "http-" + str(status), body[:300].decode("utf-8", "replace")
        try:
            err = json.loads(body)["error"]
            code, message = err.get("code", code), err.get("message", "") or ""
        except (ValueError, KeyError, TypeError):
            pass
        if status >= 500 or status in (408, 429) or status == 401:
            raise Unreachable(f"{method} {path}: {status} {code}: {message}".rstrip(": "))
        if status == 409 and code == "stale-epoch":
            raise StaleEpoch(status, code, message)
        raise ApiError(status, code, message)

    # the protocol ------------------------------------------------------------------------
    async def register(self, body: dict) -> dict:
        return await self._request("POST", "/workers/register", json_body=body)

    async def lease(self, worker_id: str, body: dict, wait_s: float) -> list[dict]:
        answer = await self._request(
            "POST",
            f"/workers/{worker_id}/lease",
            json_body=body,
            params={"wait": str(int(wait_s))},
            timeout_s=wait_s + 15,
        )
        return list(answer.get("leases") or [])

    async def heartbeat(
        self, worker_id: str, running: list[dict], timeout_s: float, cannot_work: str | None = None
    ) -> dict:
        """``cannot_work``: why the worker takes no work now (shown by the control plane);
        sent only when there is a reason, so an older control plane sees what it knows."""
        body: dict = {"running": running}
        if cannot_work:
            body["cannot_work"] = cannot_work
        return await self._request(
            "POST", f"/workers/{worker_id}/heartbeat", json_body=body, timeout_s=timeout_s
        )

    async def report(self, task: str, body: dict) -> dict:
        return await self._request("POST", f"/tasks/{task}/report", json_body=body)

    async def reports(self, worker_id: str, reports: list[dict]) -> list[dict]:
        """Several reports in one request (``{"task", "epoch", "event", ...}`` each); one
        answer each, in order: ``{"task", "epoch", "status": 200}`` or ``{..., "status":
        409, "error": {"code": "stale-epoch", ...}}``."""
        answer = await self._request(
            "POST", f"/workers/{worker_id}/reports", json_body={"reports": reports}
        )
        results = list(answer.get("results") or [])
        if len(results) != len(reports):
            raise Unreachable(
                f"the batch report answered {len(results)} results for {len(reports)} reports"
            )
        return results

    async def deregister(self, worker_id: str) -> dict:
        return await self._request("DELETE", f"/workers/{worker_id}")

    async def upload_log(self, task: str, epoch: int, offset: int, chunk: bytes) -> int:
        answer = await self._request(
            "POST",
            f"/tasks/{task}/log",
            data=chunk,
            params={"offset": str(offset), "epoch": str(epoch)},
        )
        return int(answer.get("size", offset + len(chunk)))
