"""``dpool dashboard`` on a real 3-node loopback cluster (tests/cluster/conftest.py), read
over HTTP and in a real headless browser (Debian's chromium through selenium: the
browser tests skip, saying why, where either is missing).

The browser tests drive the page as a person would: open the login URL, see the nodes,
and watch the page change by itself when a node is SIGKILLed. Set
``DPOOL_DASHBOARD_SCREENSHOT=docs/dashboard.png`` to keep a screenshot of that page.
"""

from __future__ import annotations

import http.client
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.cluster.conftest import (
    Cluster,
    base_env,
    host,
    start_cluster,
    stop_cluster,
)


@dataclass
class Dashboard:
    proc: subprocess.Popen
    lines: list[str]
    url: str
    login_url: str

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        return urllib.parse.urlsplit(self.url).port or 0

    def get(self, path: str, **headers: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def state(self, token: str) -> dict:
        status, body = self.get("/api/state", Authorization=f"Bearer {token}")
        assert status == 200, body
        return json.loads(body)

    def stop(self) -> bytes:
        """Stop it (SIGTERM, as a service manager would); what it printed after."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate(timeout=5)
        return out


def start_dashboard(env: dict, *args: str, timeout: float = 30.0) -> Dashboard:
    """``dpool dashboard --port 0`` with ``env``; returns once it printed its two lines."""
    proc = subprocess.Popen([sys.executable, "-m", "dpool", "dashboard", "--port", "0",
                             "--interval", "0.5", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while data.count(b"\n") < 2 and time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
    lines = data.decode().splitlines()
    if len(lines) < 2:
        proc.kill()
        rest = proc.communicate(timeout=5)[0]
        raise AssertionError(f"dpool dashboard did not start: {data!r} {rest!r}")
    url = lines[0].rsplit(" at ", 1)[1]
    login_url = lines[1].split("login: ", 1)[1]
    return Dashboard(proc, lines, url, login_url)


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("dash"), n_nodes=3)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def dash(cluster3: Cluster) -> Iterator[Dashboard]:
    """The dashboard on the head's host (it reads this host's record of ``dpool start``)."""
    env = base_env()
    env["DPOOL_STATE_DIR"] = cluster3.head.state_dir
    d = start_dashboard(env)
    try:
        yield d
    finally:
        d.stop()


def wait_for(what: Callable[[], object], timeout: float = 30.0, every: float = 0.2) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


# -- the command and its HTTP side -------------------------------------------------------
def test_it_prints_its_address_and_login_once_and_binds_where_the_node_binds(dash, cluster3):
    assert dash.lines[0].startswith(f"dpool dashboard: cluster {cluster3.address} at ")
    assert dash.host == host(2)  # the head node's address (its --node-ip, where it binds)
    assert dash.login_url.startswith(dash.url + "login?key=")
    assert cluster3.token not in dash.login_url
    listening = [c.laddr for c in psutil.Process(dash.proc.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN]
    assert [(a.ip, a.port) for a in listening] == [(host(2), dash.port)]
    time.sleep(1.0)  # (several refreshes later: nothing more is printed)
    with selectors.DefaultSelector() as sel:
        sel.register(dash.proc.stdout.fileno(), selectors.EVENT_READ)
        assert not sel.select(timeout=0.1)


def test_it_refuses_requests_without_the_token(dash, cluster3):
    for path in ("/", "/fragment", "/api/state"):
        status, body = dash.get(path)
        assert status == 401 and cluster3.address.encode() not in body
    assert dash.get("/api/state", Authorization="Bearer not-the-token")[0] == 401
    assert dash.get("/login?key=" + "0" * 64)[0] == 403


def test_the_state_lists_nodes_schedulers_and_shards(dash, cluster3):
    state = dash.state(cluster3.token)
    assert {n["node_id"] for n in state["nodes"]} == {n.address for n in cluster3.nodes}
    assert all(n["alive"] and n["cpus_total"] == 2 for n in state["nodes"])
    assert all(n["store_capacity"] > 0 for n in state["nodes"])
    assert len(state["global_schedulers"]) == 1 and state["global_schedulers"][0]["alive"]
    assert len(state["shards"]) == 2 and all(s["alive"] for s in state["shards"])
    assert state["errors"] == []


def test_prometheus_metrics_of_the_cluster_and_health(dash, cluster3):
    parser = pytest.importorskip("prometheus_client.parser")
    assert dash.get("/health") == (200, b"ok\n")  # (to anyone: for probes)
    assert dash.get("/metrics")[0] == 401
    status, body = dash.get("/metrics", Authorization=f"Bearer {cluster3.token}")
    assert status == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in parser.text_string_to_metric_families(body.decode())
               for s in fam.samples}
    assert samples[("dpool_nodes_alive", ())] == 3
    assert samples[("dpool_global_schedulers_alive", ())] == 1
    assert samples[("dpool_control_store_shards_alive", ())] == 2
    for n in cluster3.nodes:
        assert samples[("dpool_node_up", (("node", n.address),))] == 1
        assert samples[("dpool_node_cpus", (("kind", "total"), ("node", n.address)))] == 2
        assert samples[("dpool_node_object_store_bytes",
                        (("kind", "capacity"), ("node", n.address)))] > 0
        assert ("dpool_node_heartbeat_age_seconds", (("node", n.address),)) in samples


FAILING = textwrap.dedent("""
    import time
    from concurrent.futures import ProcessPoolExecutor

    def boom(x):
        time.sleep(0.05)
        if x % 10 == 3:
            raise ValueError(f"bad {x}")
        return x

    if __name__ == "__main__":
        with ProcessPoolExecutor() as ex:
            fs = [ex.submit(boom, i) for i in range(40)]
            print(sum(f.exception(timeout=60) is not None for f in fs))
            time.sleep(2.5)  # (the futures, and so the task rows, live a little longer)
""")


def test_tasks_per_second_and_failures_follow_a_program(dash, cluster3, tmp_path):
    out = cluster3.run_script(FAILING, tmp_path, unchanged=True)
    assert out.returncode == 0 and out.stdout.split() == ["4"], out.stderr

    def counted() -> dict | None:
        state = dash.state(cluster3.token)
        rate = state["rate"]
        done = round(sum(rate["done"]) * rate["bucket_s"])
        failed = round(sum(rate["failed"]) * rate["bucket_s"])
        return state if (done, failed) == (36, 4) else None

    state = wait_for(counted, timeout=20)
    assert state, dash.state(cluster3.token)["rate"]
    failures = state["failed"]
    assert len(failures) == 4
    assert {f["function"] for f in failures} == {"__main__.boom"}
    assert {f["node"] for f in failures} == {cluster3.address}  # submitted on the head
    assert all(f["attempts"] == 1 for f in failures)


def test_it_finds_the_cluster_from_a_host_without_its_record(cluster3, tmp_path):
    """DPOOL_ADDRESS and DPOOL_TOKEN only: the node names the control store's shards; no
    node of the cluster runs on this 'host', so it listens on loopback."""
    env = cluster3.driver_env(DPOOL_STATE_DIR=str(tmp_path / "elsewhere"))
    d = start_dashboard(env)
    try:
        assert d.host == "127.0.0.1"
        nodes = d.state(cluster3.token)["nodes"]
        assert {n["node_id"] for n in nodes} == {n.address for n in cluster3.nodes}
    finally:
        d.stop()


def test_a_wrong_token_or_no_cluster_is_a_clear_error(cluster3, tmp_path):
    env = cluster3.driver_env(DPOOL_TOKEN="wrong", DPOOL_STATE_DIR=str(tmp_path / "a"))
    out = subprocess.run([sys.executable, "-m", "dpool", "dashboard"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1 and "dpool dashboard:" in out.stderr, out.stderr
    env = base_env()
    env["DPOOL_STATE_DIR"] = str(tmp_path / "b")  # nothing started on this host
    out = subprocess.run([sys.executable, "-m", "dpool", "dashboard"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1 and out.stdout == ""
    assert "needs a cluster" in out.stderr and "DPOOL_ADDRESS" in out.stderr


# -- in a real browser -------------------------------------------------------------------
def _browser_missing() -> str:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install '.[test]')"
    missing = [b for b in ("chromium", "chromedriver") if shutil.which(b) is None]
    if missing:
        return (f"{' and '.join(missing)} not found (Debian: apt-get install chromium "
                "chromium-driver; .ci/run tries to)")
    return ""


needs_browser = pytest.mark.skipif(bool(_browser_missing()), reason=_browser_missing())


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1500", f"--user-data-dir={tmp_path / 'profile'}",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or ""),
                              options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _node_states(driver) -> dict:
    """``{node id: "alive" | "dead"}`` as the page shows it now (read in one script: the
    page swaps its rows while it refreshes)."""
    return driver.execute_script(
        "var o = {}; document.querySelectorAll('tr.node').forEach("
        "function (r) { o[r.dataset.node] = r.dataset.state; }); return o;")


@needs_browser
@pytest.mark.timeout(120)
def test_a_browser_without_the_login_sees_nothing(dash, cluster3, browser):
    browser.get(dash.url)
    text = browser.find_element("tag name", "body").text
    assert "401" in text and cluster3.address not in browser.page_source
    assert _node_states(browser) == {}
    browser.get(dash.url + "login?key=wrong")
    assert "wrong login key" in browser.find_element("tag name", "body").text
    browser.get(dash.url + "api/state")
    assert cluster3.address not in browser.page_source


SLOW = textwrap.dedent("""
    import time
    from concurrent.futures import ProcessPoolExecutor

    def slow(x):
        time.sleep(3)
        return x

    if __name__ == "__main__":
        with ProcessPoolExecutor() as ex:
            print(sum(ex.map(slow, range(8))))
""")


@needs_browser
@pytest.mark.timeout(180)
def test_the_page_lists_the_nodes_and_shows_a_killed_one_dead(dash, cluster3, browser,
                                                              tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(dash.login_url)
    assert browser.current_url == dash.url  # the login redirected to the page
    nodes = {n.address for n in cluster3.nodes}
    WebDriverWait(browser, 20).until(lambda d: set(_node_states(d)) == nodes)
    assert set(_node_states(browser).values()) == {"alive"}
    assert browser.find_element("id", "rate-chart").tag_name == "svg"
    browser.execute_script("window.sameDocument = 1;")  # gone if the page reloaded

    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    work = subprocess.Popen([sys.executable, "-m", "dpool", "run", str(script)],
                            cwd=tmp_path, env=cluster3.driver_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        WebDriverWait(browser, 30).until(
            lambda d: d.find_elements("css selector", "tr.running"))
        victim = cluster3.nodes[2]
        os.kill(victim.pid, signal.SIGKILL)
        WebDriverWait(browser, 40, poll_frequency=0.25).until(
            lambda d: _node_states(d).get(victim.address) == "dead")
        states = _node_states(browser)
        assert {a: s for a, s in states.items() if a != victim.address} == {
            n.address: "alive" for n in cluster3.nodes[:2]}
        assert browser.execute_script("return window.sameDocument;") == 1  # updated live
        WebDriverWait(browser, 20, poll_frequency=0.25).until(  # its tasks left the list
            lambda d: not d.execute_script(
                "var a = arguments[0]; return Array.from(document.querySelectorAll("
                "'tr.running')).filter(function (r) { return r.textContent.indexOf(a) >= 0; })"
                ".length;",
                victim.address))
        shot = os.environ.get("DPOOL_DASHBOARD_SCREENSHOT")
        if shot:
            browser.save_screenshot(shot)
        out, err = work.communicate(timeout=90)
        assert work.returncode == 0 and out.split() == [str(sum(range(8)))], err
    finally:
        if work.poll() is None:
            work.kill()
            work.communicate(timeout=10)
