"""The viewer's web application (Starlette) and how it is served (uvicorn).

Safe by construction:
- The page is static JavaScript served by this server; model output and prompts reach it as JSON and are
  put in the page with textContent only. A strict Content-Security-Policy (no inline script or style,
  nothing from other origins, no frames, no forms) is on every response.
- Run directories are named in URLs by a plain name checked by `evalkit.viewer.safety`; any request
  whose raw path holds an encoded slash or backslash, a dot segment or a NUL is answered 404 before
  routing. Static files are a fixed list, not a directory.
- The only writes are the review endpoints (POST), which need the token made at each start (sent in the
  page's meta tag, returned in a header: another site's page cannot read it) and a same-origin Origin
  when the browser sends one: 403 otherwise.
- The Host header must name this server (DNS rebinding); binding beyond loopback needs `allow_remote`
  and a password (HTTP Basic, compared in constant time).
"""
from __future__ import annotations

import base64
import hmac
import json
import secrets
import socket
import sys
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from evalkit.errors import EvalkitError, RatingSheetError
from evalkit.viewer import review as review_mod
from evalkit.viewer.compare import compare_runs, default_pairs
from evalkit.viewer.index import IndexCache, Query
from evalkit.viewer.overview import overview
from evalkit.viewer.runs import list_runs
from evalkit.viewer.safety import NotFound, run_names, run_path

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'none'; object-src 'none'; media-src 'none'; frame-src 'none'; worker-src 'none'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "cache-control": "no-store",
}
STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_BAD_RAW = (b"%2f", b"%5c", b"%00", b"%2e", b"\\", b"/../", b"/./", b"//")


@dataclass
class Settings:
    root: Path
    host: str = "127.0.0.1"
    port: int = 0
    password: str | None = None
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))


def _static(name: str) -> bytes:
    return (resources.files("evalkit.viewer") / "static" / name).read_bytes()


def _page(token: str) -> bytes:
    html = _static("index.html").decode("utf-8")
    return html.replace("{{TOKEN}}", token).encode("utf-8")  # url-safe base64: nothing to escape


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "") in ("1", "true", "yes", "on")


def _int(request: Request, name: str, default: int) -> int:
    try:
        return int(request.query_params.get(name, default))
    except ValueError:
        return default


class SecurityMiddleware:
    """Raw-path, Host, password and write-token checks; security headers on every response."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secure(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.decode("latin-1").lower() not in SECURITY_HEADERS]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        raw = (scope.get("raw_path") or scope["path"].encode("utf-8")).split(b"?", 1)[0].lower()
        path = scope["path"]
        if any(b in raw for b in _BAD_RAW) or ".." in path or "\x00" in path or raw.endswith(b"/.."):
            await self._plain(send_secure, 404, "not found")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not self._host_ok(headers.get("host", "")):
            await self._plain(send_secure, 421, "unknown host")
            return
        if self.settings.password is not None and not self._auth_ok(headers.get("authorization", "")):
            await send_secure({"type": "http.response.start", "status": 401,
                               "headers": [(b"www-authenticate", b'Basic realm="evalkit view"'),
                                           (b"content-type", b"text/plain; charset=utf-8")]})
            await send_secure({"type": "http.response.body", "body": b"password required"})
            return
        if scope["method"] not in ("GET", "HEAD"):
            token = headers.get("x-evalkit-token", "")
            origin = headers.get("origin")
            same_origin = origin is None or origin.split("://", 1)[-1] == headers.get("host", "")
            if not (token and hmac.compare_digest(token, self.settings.token)) or not same_origin:
                await self._plain(send_secure, 403, "forbidden: writes need this viewer's token")
                return
        await self.app(scope, receive, send_secure)

    def _host_ok(self, host: str) -> bool:
        if self.settings.password is not None:
            return True  # a remote viewer is reached by whatever name; the password guards it
        name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1:].split("]", 1)[0]
        return name in LOOPBACK

    def _auth_ok(self, header: str) -> bool:
        if not header.lower().startswith("basic "):
            return False
        try:
            user_pass = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return False
        password = user_pass.split(":", 1)[-1]
        return hmac.compare_digest(password.encode(), (self.settings.password or "").encode())

    @staticmethod
    async def _plain(send: Callable[[dict], Awaitable[None]], status: int, text: str) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": text.encode()})


def create_app(settings: Settings) -> SecurityMiddleware:
    root = settings.root.resolve()
    cache = IndexCache()

    def run_of(request: Request, name: str | None = None) -> Path:
        return run_path(root, name if name is not None else request.path_params["run"])

    def page(request: Request) -> Response:
        return Response(_page(settings.token), media_type="text/html; charset=utf-8")

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            raise NotFound(name)
        return Response(_static(name), media_type=STATIC[name])

    def favicon(request: Request) -> Response:
        return Response(status_code=204)  # browsers ask for one; none is needed

    def runs(request: Request) -> Response:
        return JSONResponse({"root": root.name, "runs": list_runs(root)})

    overviews: dict[Path, tuple[tuple, dict[str, Any]]] = {}

    def run_overview(request: Request) -> Response:
        path = run_of(request)
        stamp = tuple(_stat(path / name) for name in ("manifest.json", "scores.csv", "comparisons.csv", "decision.json"))
        kept = overviews.get(path)
        if kept is None or kept[0] != stamp:  # the report's tables, recomputed only when their files change
            kept = overviews[path] = (stamp, overview(path))
        return JSONResponse({**kept[1], **{"facets": cache.get(path).facets()}})

    def items(request: Request) -> Response:
        index = cache.get(run_of(request))
        p = request.query_params
        query = Query(suite=p.get("suite", ""), category=p.get("category", ""), deployment=p.get("deployment", ""),
                      differs=_flag(request, "differs"), flipped=_flag(request, "flipped"), failed=_flag(request, "failed"),
                      q=p.get("q", "")[:500], sort=p.get("sort", ""), desc=_flag(request, "desc"),
                      offset=_int(request, "offset", 0), limit=_int(request, "limit", 50))
        return JSONResponse(index.page(query))

    def item(request: Request) -> Response:
        index = cache.get(run_of(request))
        found = index.item(request.query_params.get("suite", ""), request.query_params.get("id", ""))
        if found is None:
            raise NotFound("item")
        return JSONResponse(found)

    def compare(request: Request) -> Response:
        cand = run_of(request, request.query_params.get("candidate", ""))
        base = run_of(request, request.query_params.get("baseline", ""))
        pairs = [(a, b) for a, _, b in (p.partition("|") for p in request.query_params.getlist("pair") if "|" in p)]
        if not pairs:
            pairs = default_pairs(cache.get(cand).deployments, cache.get(base).deployments)
        return JSONResponse(compare_runs(cand, base, pairs, cache))

    history_memory: dict[str, Any] = {}
    history_lock = threading.Lock()

    def trends(request: Request) -> Response:  # a metric across the folder's runs (evalkit.history; writes nothing)
        from evalkit.history import trend

        p = request.query_params
        with history_lock:
            return JSONResponse(trend(root, p.get("suite", "")[:200], p.get("metric", "")[:200], p.get("category", "")[:200],
                                      memory=history_memory))

    async def _body(request: Request) -> dict[str, Any]:
        if not request.headers.get("content-type", "").startswith("application/json"):
            raise review_mod.ReviewError("send JSON")
        data = json.loads(await request.body() or b"{}")
        if not isinstance(data, dict):
            raise review_mod.ReviewError("send a JSON object")
        return data

    async def review_sheet(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        path = run_of(request)
        data = await _body(request)
        return JSONResponse(await run_in_threadpool(review_mod.sheet_view, path, str(data.get("rater", ""))))

    async def review_rate(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        path = run_of(request)
        data = await _body(request)
        result = await run_in_threadpool(review_mod.rate, path, str(data.get("rater", "")), str(data.get("row_id", "")),
                                         data.get("score"), data.get("comment") or "")
        return JSONResponse(result)

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "not found"}, status_code=404)

    async def bad_request(request: Request, exc: Exception) -> Response:
        status = 409 if isinstance(exc, RatingSheetError) else 400
        return JSONResponse({"error": str(exc)}, status_code=status)

    routes = [
        Route("/", page),
        Route("/static/{name}", static),
        Route("/favicon.ico", favicon),
        Route("/api/runs", runs),
        Route("/api/runs/{run}/overview", run_overview),
        Route("/api/runs/{run}/items", items),
        Route("/api/runs/{run}/item", item),
        Route("/api/compare", compare),
        Route("/api/trends", trends),
        Route("/api/runs/{run}/review/sheet", review_sheet, methods=["POST"]),
        Route("/api/runs/{run}/review/rate", review_rate, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={
        NotFound: not_found, 404: not_found, review_mod.ReviewError: bad_request, EvalkitError: bad_request,
        json.JSONDecodeError: bad_request})
    app.state.cache = cache
    return SecurityMiddleware(app, settings)


def serve(root: Path, host: str = "127.0.0.1", port: int = 8765, *, allow_remote: bool = False,
          password: str | None = None, ready: Callable[[str], None] | None = None) -> None:
    """Serve `root` until interrupted. Beyond loopback only with `allow_remote` and a password."""
    import uvicorn

    if not root.is_dir():
        raise EvalkitError(str(root), "no such reports folder")
    focus = ""
    if (root / "manifest.json").is_file():  # a run directory: serve its folder and open at this run
        focus, root = f"#/run/{root.resolve().name}", root.resolve().parent
    if host not in LOOPBACK:
        if not allow_remote:
            raise EvalkitError(host, "binding beyond this machine needs --allow-remote (and EVALKIT_VIEW_PASSWORD)")
        if not password:
            raise EvalkitError(host, "a viewer reachable from other machines needs a password: set EVALKIT_VIEW_PASSWORD")
    settings = Settings(root=root, host=host, port=port, password=password if host not in LOOPBACK else None)
    app = create_app(settings)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        raise EvalkitError(f"{host}:{port}", f"cannot listen there ({e.strerror})") from None
    sock.listen(128)  # listening before the URL is shown: early connections wait in the backlog for uvicorn
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/{focus}"
    # In the background: import the report's modules (the first run page would wait ~1 s for them) and index
    # the newest runs, so the first look at a big run finds it built.
    def warm_up() -> None:
        import importlib

        for module in ("evalkit.report.decision_section", "evalkit.report.verdict", "evalkit.report.view"):
            importlib.import_module(module)

        app.app.state.cache.warm([run_path(root.resolve(), n) for n in run_names(root.resolve())[:3]])

    threading.Thread(target=warm_up, daemon=True).start()
    print(f"evalkit: viewer at {url} (reports folder {root}; Ctrl-C stops it)", file=sys.stderr, flush=True)
    if ready is not None:
        ready(url)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
