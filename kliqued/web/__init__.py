"""The dashboard (issue 13): server-rendered pages served by ``kliqued serve`` at ``/``, in the
daemon's own application (same port, same tokens and roles).

``handlers`` (routes, sign-in, pages, downloads, static files), ``session`` (the session
store and the CSRF checks), ``data`` (what each page shows, through the API's own views and
access rules), ``templates/`` (Jinja2) and ``static/`` (the page script and style; plotly.js
is served from the installed plotly package). docs/dashboards.md describes the pages.
"""
