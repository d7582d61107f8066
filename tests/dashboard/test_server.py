"""The dashboard's HTTP server on a real socket: nothing without the token or the login
cookie derived from it, the login URL sets that cookie, and every answer forbids content
from elsewhere (its Content-Security-Policy admits exactly the page's own script)."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
from collections.abc import Iterator

import pytest

from dpool.dashboard._server import DashboardServer, login_key, session_cookie

TOKEN = b"0123456789abcdef0123456789abcdef"
SNAP = {"cluster": "127.0.0.2:6380", "updated": 1.0, "errors": [], "shards": [],
        "nodes": [{"node_id": "127.0.0.2:6380", "alive": True}], "global_schedulers": [],
        "rate": {"bucket_s": 5.0, "done": [], "failed": []},
        "running": {"count": 0, "tasks": []}, "failed": []}


@pytest.fixture
def server() -> Iterator[DashboardServer]:
    s = DashboardServer(lambda: SNAP, TOKEN, "127.0.0.1", 0, period_s=1.0)
    s.start()
    try:
        yield s
    finally:
        s.close()


def get(s: DashboardServer, path: str, **headers: str) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/", "/fragment", "/api/state", "/nope", "/login"])
def test_nothing_is_served_without_the_token(server, path):
    status, _, body = get(server, path)
    assert status in (401, 403), (status, body)
    assert b"127.0.0.2" not in body and b"<html" not in body


def test_a_wrong_token_key_or_cookie_is_refused(server):
    assert get(server, "/api/state", Authorization="Bearer wrong")[0] == 401
    assert get(server, "/api/state", Authorization="Basic " + TOKEN.decode())[0] == 401
    assert get(server, "/", Cookie=f"{server.cookie_name}=deadbeef")[0] == 401
    assert get(server, "/", Cookie=f"other={session_cookie(TOKEN)}")[0] == 401
    assert get(server, "/login?key=" + "0" * 64)[0] == 403
    assert get(server, "/login?token=wrong")[0] == 403


def test_the_login_url_sets_the_cookie_that_opens_the_page(server):
    assert server.login_url == f"http://127.0.0.1:{server.port}/login?key={login_key(TOKEN)}"
    assert TOKEN.decode() not in server.login_url  # the URL does not carry the token
    status, headers, _ = get(server, server.login_url.split(str(server.port), 1)[1])
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, _, body = get(server, "/", Cookie=cookie.split(";")[0])
    assert status == 200 and b"127.0.0.2:6380" in body
    # the cluster token itself logs in too
    status, headers, _ = get(server, "/login?token=" + TOKEN.decode())
    assert status == 303 and headers["Set-Cookie"] == cookie


def test_a_script_with_the_token_reads_the_state(server):
    status, headers, body = get(server, "/api/state", Authorization=f"Bearer {TOKEN.decode()}")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == SNAP
    assert get(server, "/nope", Authorization=f"Bearer {TOKEN.decode()}")[0] == 404


def test_the_policy_admits_the_pages_own_script_and_style_only(server):
    status, headers, body = get(server, "/", Authorization=f"Bearer {TOKEN.decode()}")
    assert status == 200
    csp = headers["Content-Security-Policy"]
    page = body.decode()

    def digest(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()

    script = re.search(r"<script>(.*?)</script>", page, re.DOTALL).group(1)
    style = re.search(r"<style>(.*?)</style>", page, re.DOTALL).group(1)
    assert f"script-src {digest(script)}'" in csp and f"style-src {digest(style)}'" in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert headers["Cache-Control"] == "no-store" and headers["X-Frame-Options"] == "DENY"


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        DashboardServer(lambda: SNAP, b"", "127.0.0.1", 0)
