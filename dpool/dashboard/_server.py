"""The dashboard's HTTP server (the stdlib's ``ThreadingHTTPServer``) and its login.

It serves nothing to a request that does not prove it knows the cluster token: every
path but ``/health`` (``ok``, for probes), a wrong one included, answers 401 unless the
request carries

- the login cookie, ``HMAC(token, "dpool-dashboard-session")``, set by
  ``/login?key=K`` where ``K = HMAC(token, "dpool-dashboard-login")`` (the login URL
  ``dpool dashboard`` prints: it opens the dashboard, not the cluster, and reveals
  nothing of the token) or by ``/login?token=<the cluster token>``; or
- ``Authorization: Bearer <the cluster token>`` (for scripts: ``curl -H ... /api/state``).

Paths: ``/`` the page, ``/fragment`` its live part (what the page's script fetches),
``/api/state`` the snapshot as JSON, ``/metrics`` the cluster's gauges in Prometheus'
text format (``node.metrics.render_cluster``), and ``/health`` (``ok``, to anyone). Every answer forbids caching, framing and any
content from elsewhere (Content-Security-Policy: only the page's own script and style,
by hash, and requests back to this server).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable

from dpool.dashboard import _render

log = logging.getLogger("dpool.dashboard")


def login_key(token: bytes) -> str:
    """What the login URL carries (derived from the token; it does not reveal it)."""
    return hmac.new(token, b"dpool-dashboard-login", hashlib.sha256).hexdigest()


def session_cookie(token: bytes) -> str:
    """The login cookie's value."""
    return hmac.new(token, b"dpool-dashboard-session", hashlib.sha256).hexdigest()


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    dashboard: DashboardServer


class DashboardServer:
    """Serves ``snapshot()`` (``Collector.snapshot``) at ``bind:port`` (0: any free port)
    to requests that know ``token``; the page refreshes every ``period_s``."""

    def __init__(self, snapshot: Callable[[], dict], token: bytes, bind: str = "127.0.0.1",
                 port: int = 0, period_s: float = 2.0, advertise: str | None = None) -> None:
        if not token:
            raise ValueError("the dashboard needs the cluster token")
        self.snapshot = snapshot
        self.period_ms = max(100, int(period_s * 1000))
        self._login_key = login_key(token)
        self.cookie_value = session_cookie(token)
        self._token = token
        server_cls = type("_Server", (_HTTPServer,), {
            "address_family": socket.AF_INET6 if ":" in bind else socket.AF_INET})
        self.httpd = server_cls((bind, port), _Handler)
        self.httpd.dashboard = self
        self.host = (advertise or bind) if bind in ("", "0.0.0.0", "::") else bind
        self.port = self.httpd.server_address[1]
        self.cookie_name = f"dpool_dashboard_{self.port}"
        self.csp = ("default-src 'none'; "
                    f"script-src {_csp_hash(_render.script(self.period_ms))}; "
                    f"style-src {_csp_hash(_render.STYLE)}; connect-src 'self'; "
                    "img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                    "frame-ancestors 'none'")
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def login_url(self) -> str:
        return f"{self.url}login?key={self._login_key}"

    def authorized(self, cookie_header: str | None, authorization: str | None) -> bool:
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(
                    value.strip().encode(), self._token):
                return True
        for part in (cookie_header or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie_name and hmac.compare_digest(value.encode(),
                                                                self.cookie_value.encode()):
                return True
        return False

    def login_ok(self, query: dict) -> bool:
        key = (query.get("key") or [""])[0].encode()
        token = (query.get("token") or [""])[0].encode()
        return (bool(key) and hmac.compare_digest(key, self._login_key.encode())) or (
            bool(token) and hmac.compare_digest(token, self._token))

    # -- lifetime ------------------------------------------------------------------------
    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> None:
        """Serve in a thread (``close`` stops it)."""
        self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                        name="dpool-dashboard-http")
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5.0)
            self._thread = None
        self.httpd.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer
    timeout = 30  # a client that stops sending holds a thread no longer than this
    server_version = "dpool-dashboard"
    sys_version = ""

    def do_GET(self) -> None:
        d = self.server.dashboard
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/login":
            if d.login_ok(urllib.parse.parse_qs(url.query)):
                self._send(303, b"", "text/plain", [
                    ("Location", "/"),
                    ("Set-Cookie", (f"{d.cookie_name}={d.cookie_value}; Path=/; HttpOnly; "
                                   "SameSite=Strict"))])
            else:
                self._send(403, b"wrong login key\n", "text/plain")
            return
        if url.path == "/health":  # (for probes: says nothing but that it serves)
            self._send(200, b"ok\n", "text/plain")
            return
        if not d.authorized(self.headers.get("Cookie"), self.headers.get("Authorization")):
            self._send(401, b"401: this dashboard shows a dpool cluster only to who knows "
                            b"its token: open the login URL that `dpool dashboard` printed\n",
                       "text/plain", [("WWW-Authenticate", 'Bearer realm="dpool"')])
            return
        if url.path == "/":
            body = _render.page(d.snapshot(), d.period_ms).encode()
            self._send(200, body, "text/html; charset=utf-8")
        elif url.path == "/fragment":
            self._send(200, _render.fragment(d.snapshot()).encode(), "text/html; charset=utf-8")
        elif url.path == "/api/state":
            self._send(200, json.dumps(d.snapshot()).encode(), "application/json")
        elif url.path == "/metrics":  # (Prometheus: the token as a Bearer token)
            from dpool.node import metrics as _metrics

            self._send(200, _metrics.render_cluster(d.snapshot()).encode(),
                       "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain")

    def _send(self, status: int, body: bytes, ctype: str,
              headers: list | None = None) -> None:
        d = self.server.dashboard
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", d.csp)
        for k, v in headers or ():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # (the login URL's key is in the request line: never at a level shown by default)
        log.debug("%s %s", self.address_string(), format % args)
