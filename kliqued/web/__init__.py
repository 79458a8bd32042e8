"""The dashboard (issue 13): server-rendered pages served by ``kliqued serve`` at ``/``, in the
daemon's own application (same port, same tokens and roles).

``routes`` (what the daemon's application installs), ``signin`` (sign-in, sign-out),
``pages`` (the six pages and their live fragments), ``files`` (the ledger download, task
logs, static files), ``frame`` (what every answer shares: templates, headers, error pages,
who is signed in), ``fragments`` (one rendering of a live fragment for the browsers that ask
at once), ``session`` (the session store and the CSRF checks), ``data`` (what each page
shows, through the API's own views and access rules), ``templates/`` (Jinja2) and
``static/`` (the page script and style; plotly.js is served from the installed plotly
package). docs/dashboards.md describes the pages.
"""
