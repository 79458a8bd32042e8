"""Live fragments shared by the browsers that ask for the same one at once."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Awaitable, Callable

from aiohttp import web


class Fragments:
    """Live fragments being made or just made, by (principal, page, view, event sequence,
    second): a request for one already in the making awaits it instead of rendering again.
    A fragment holds no session value (no CSRF token), so one principal's sessions share."""

    KEEP = 256

    def __init__(self) -> None:
        self._by_key: OrderedDict[Any, asyncio.Future[tuple[int, bytes, dict[str, str]]]] = (
            OrderedDict()
        )

    async def once(self, key: Any, make: Callable[[], Awaitable[web.Response]]) -> web.Response:
        fut = self._by_key.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._by_key[key] = fut
            while len(self._by_key) > self.KEEP:
                self._by_key.popitem(last=False)
            try:
                resp = await make()
            except BaseException:
                self._by_key.pop(key, None)
                fut.cancel()
                raise
            assert isinstance(resp.body, bytes)
            fut.set_result((resp.status, resp.body, dict(resp.headers)))
            return resp
        status, body, headers = await asyncio.shield(fut)
        return web.Response(status=status, body=body, headers=headers)
