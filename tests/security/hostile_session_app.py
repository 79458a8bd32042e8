"""A hostile session app for tests/security/test_session_origin.py: an aiohttp server on
127.0.0.1:$KLIQUE_SESSION_PORT under $KLIQUE_SESSION_PREFIX, as a session's app must be.

``GET <prefix>`` is a page whose script tries what a session's author would, against the
dashboard whose URL is this program's first argument: fetch its pages and API with the
browser's cookies, frame it and read the frame, read ``document.cookie``, plant a
``klique_session`` cookie (path ``/`` and a longer path); the answer also tries to set the
control plane's cookies, a cookie for every path, and to clear the whole site's cookies. What
the script managed is left in ``window.results`` (``window.done`` once finished).
``GET <prefix>headers`` answers the headers it received."""

import json
import os
import sys

from aiohttp import web

PREFIX = os.environ["KLIQUE_SESSION_PREFIX"]
DASHBOARD = sys.argv[1]

PAGE = """<!doctype html><html><body><h1>hostile</h1>
<script>
const D = %s;
const results = {cookie: document.cookie, reads: {}, frame: null};
async function grab(path) {
  try {
    const r = await fetch(D + path, {credentials: 'include'});
    results.reads[path] = r.status + ' ' + (await r.text()).slice(0, 2000);
  } catch (e) { results.reads[path] = 'refused: ' + e; }
}
async function main() {
  for (const p of ['/audit', '/orchestration', '/v1/tasks', '/v1/events', '/signin'])
    await grab(p);
  await new Promise(done => {
    const f = document.createElement('iframe');
    f.src = D + '/audit';
    f.onload = () => {
      try { results.frame = f.contentDocument.body.innerText.slice(0, 2000); }
      catch (e) { results.frame = 'refused: ' + e; }
      done();
    };
    setTimeout(done, 3000);
    document.body.appendChild(f);
  });
  document.cookie = 'klique_session=planted-by-script; path=/';
  document.cookie = 'klique_session=planted-longer-path; path=/audit';
  document.cookie = 'klique_session=planted-orchestration; path=/orchestration';
  results.cookie_after = document.cookie;
  window.results = results;
  window.done = true;
}
main();
</script></body></html>"""


async def index(request: web.Request) -> web.Response:
    resp = web.Response(text=PAGE % json.dumps(DASHBOARD), content_type="text/html")
    resp.headers.add("Set-Cookie", "klique_session=planted-by-http; Path=/")
    resp.headers.add("Set-Cookie", "klique_app_session=planted; Path=/")
    resp.headers.add("Set-Cookie", "everywhere=hostile; Path=/")
    resp.headers.add("Set-Cookie", "widedomain=hostile; Domain=127.0.0.1; Path=" + PREFIX)
    resp.headers.add("Set-Cookie", f"own=hostile-own; Path={PREFIX}")
    resp.headers["Clear-Site-Data"] = '"cookies", "storage"'
    resp.headers["Service-Worker-Allowed"] = "/"
    return resp


async def headers(request: web.Request) -> web.Response:
    return web.json_response({"headers": dict(request.headers)})


app = web.Application()
app.router.add_get(PREFIX, index)
app.router.add_get(PREFIX + "headers", headers)
web.run_app(app, host="127.0.0.1", port=int(os.environ["KLIQUE_SESSION_PORT"]), print=None)
