"""A local HTTP server playing the GitHub and GitLab comment APIs, for ``kliqued ci comment``:
real HTTP on a free port, the comments kept in memory, every request recorded."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

GITHUB_LIMIT = 65_536


class Forge:
    def __init__(self) -> None:
        self.comments: dict[int, str] = {}
        self.next_id = 100
        self.requests: list[tuple[str, str]] = []
        self.auth: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Forge":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, body: str) -> int:
        self.next_id += 1
        self.comments[self.next_id] = body
        return self.next_id

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        forge = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _reply(self, status: int, data: Any = None) -> None:
                raw = b"" if data is None else json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else {}

            def _route(self, method: str) -> None:
                u = urlparse(self.path)
                forge.requests.append((method, u.path))
                forge.auth.append(
                    self.headers.get("Authorization") or self.headers.get("PRIVATE-TOKEN") or ""
                )
                q = parse_qs(u.query)
                gh_list = re.fullmatch(r"/repos/acme/estate/issues/7/comments", u.path)
                gh_one = re.fullmatch(r"/repos/acme/estate/issues/comments/(\d+)", u.path)
                gl_list = re.fullmatch(
                    r"/api/v4/projects/acme%2Festate/merge_requests/7/notes", u.path
                )
                gl_one = re.fullmatch(
                    r"/api/v4/projects/acme%2Festate/merge_requests/7/notes/"
                    r"(\d+)",
                    u.path,
                )
                if method == "GET" and (gh_list or gl_list):
                    per, page = int(q["per_page"][0]), int(q.get("page", ["1"])[0])
                    items = sorted(forge.comments.items())[(page - 1) * per : page * per]
                    return self._reply(
                        200, [{"id": i, "body": b, "system": False} for i, b in items]
                    )
                if method == "POST" and (gh_list or gl_list):
                    body = self._body()["body"]
                    if len(body) > GITHUB_LIMIT:
                        return self._reply(422, {"message": "Body is too long"})
                    return self._reply(201, {"id": forge.add(body)})
                m = gh_one or gl_one
                if m and int(m.group(1)) in forge.comments:
                    cid = int(m.group(1))
                    if method in ("PATCH", "PUT"):
                        body = self._body()["body"]
                        if len(body) > GITHUB_LIMIT:
                            return self._reply(422, {"message": "Body is too long"})
                        forge.comments[cid] = body
                        return self._reply(200, {"id": cid})
                    if method == "DELETE":
                        del forge.comments[cid]
                        return self._reply(204)
                return self._reply(404, {"message": "Not Found"})

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PATCH(self) -> None:
                self._route("PATCH")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        return H
