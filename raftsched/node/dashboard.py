"""The dashboard (docs/ui.md): static files shipped in the package (``node/ui/``), served by every
node at ``/ui/`` with no token (they hold no data: the page asks for a token and reads the JSON
API with it), a strict Content-Security-Policy (no inline script or style, nothing from another
origin) and the content type of each file. Only the files named in ``FILES`` are served, so no
request path reaches the file system."""
from __future__ import annotations

from importlib import resources

from aiohttp import web

from ..core.errors import NotFound
from .routes import OPEN, Route, Tenancy

#: The files of the page and their content types; nothing else under /ui/ is served.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

#: Scripts, styles and images from this origin only, API calls to this origin only, no inline
#: script or style, no plugin, no frame around the page, no form posted elsewhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}

_cache: dict[str, bytes] = {}


def _read(name: str) -> bytes:
    data = _cache.get(name)
    if data is None:
        data = (resources.files(__package__) / "ui" / name).read_bytes()
        _cache[name] = data
    return data


def _file(name: str) -> web.Response:
    ctype = FILES.get(name)
    if ctype is None:
        raise NotFound(f"no file {name[:100]!r} in the dashboard", field="file")
    return web.Response(body=_read(name), headers=dict(HEADERS, **{"Content-Type": ctype}))


async def ui_root(request: web.Request) -> web.StreamResponse:
    if request.path == "/ui":
        raise web.HTTPPermanentRedirect("/ui/")  # (a query string is dropped: the page reads none)
    return _file("index.html")


async def ui_file(request: web.Request) -> web.Response:
    return _file(request.match_info["file"])


#: The dashboard's rows of the route table (node/routes.py): open, like /healthz.
UI_ROUTES = (
    Route("GET", "/ui", ui_root, OPEN, Tenancy.SHARED, "the dashboard (a redirect to /ui/)", ok=308,
          response="redirect", any_query=True),
    Route("GET", "/ui/", ui_root, OPEN, Tenancy.SHARED, "the dashboard's page (no token: it asks for one)",
          response="html", any_query=True),
    Route("GET", "/ui/{file}", ui_file, OPEN, Tenancy.SHARED, "the dashboard's script, style and icon",
          errors=(404,), response="static", any_query=True),
)
