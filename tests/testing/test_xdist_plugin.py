"""The pytest-xdist backend (``pytest -n N --dpool``, dpool.testing).

Each test runs pytest in a subprocess on a small generated suite, with and without
``--dpool``, and compares what the two report. Every inner run carries a unique
environment variable, so any process it leaves behind (bridge, dpool worker, test
worker) is found afterwards, and its own ``TMPDIR``, so a leftover listener directory is
found too.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from dpool.protocol import _auth

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120

SUITE = {
    "test_mixed.py": '''
        import os, sys, pytest

        @pytest.mark.parametrize("i", range(8))
        def test_pass(i):
            print("captured out", i)

        def test_fail():
            print("this is printed")
            assert 1 == 2

        @pytest.mark.skip(reason="no")
        def test_skip():
            pass

        @pytest.mark.xfail
        def test_xfail():
            assert 0

        @pytest.mark.xfail
        def test_xpass():
            pass

        @pytest.fixture
        def broken():
            raise RuntimeError("fixture fails")

        def test_error(broken):
            pass

        @pytest.mark.slow
        def test_marked():
            pass
    ''',
    "test_classes.py": '''
        import pytest

        class TestA:
            @pytest.mark.parametrize("i", range(5))
            def test_a(self, i):
                pass

        class TestB:
            def test_b(self):
                assert "b" == "c"

        @pytest.mark.xdist_group("g1")
        def test_group_1():
            pass

        @pytest.mark.xdist_group("g1")
        def test_group_2():
            pass
    ''',
    "sub/test_nested.py": '''
        import helper

        def test_uses_conftest(answer):
            assert answer == 42

        def test_sys_path():
            assert helper.VALUE == "helper"
    ''',
    "sub/conftest.py": '''
        import pytest

        @pytest.fixture
        def answer():
            return 42
    ''',
    "helper.py": 'VALUE = "helper"\n',
    "pytest.ini": '[pytest]\nmarkers =\n    slow: slow\npythonpath = .\n',
}

CRASH = '''
    import os

    def test_ok_1():
        pass

    def test_crash():
        os._exit(1)

    def test_ok_2():
        pass

    def test_ok_3():
        pass
'''

_COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?|deselected)")


def plugin_args() -> list[str]:
    """``-p dpool.testing._plugin`` unless the ``pytest11`` entry point loads it."""
    eps = importlib.metadata.entry_points(group="pytest11")
    if any(ep.name == "dpool" and ep.value == "dpool.testing._plugin" for ep in eps):
        return []
    return ["-p", "dpool.testing._plugin"]


def write_suite(where: Path, files: dict) -> Path:
    for name, text in files.items():
        path = where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return where


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, mark: str, tmpdir: Path) -> None:
        self.proc = proc
        self.mark = mark
        self.tmpdir = tmpdir
        self.out = proc.stdout + proc.stderr

    def counts(self) -> dict:
        lines = [ln for ln in self.proc.stdout.splitlines() if " in " in ln and
                 _COUNT.search(ln)]
        assert lines, self.out[-3000:]
        found = {k.rstrip("s") if k.startswith("error") else k: int(n)
                 for n, k in _COUNT.findall(lines[-1])}
        return found


def inner_env(tmpdir: Path, mark: str, **extra: str) -> dict:
    env = dict(os.environ)
    for k in ("DPOOL_ADDRESS", "DPOOL_TOKEN", "DPOOL_STATE_DIR", "PYTEST_XDIST_WORKER",
              "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
              "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TMPDIR"] = str(tmpdir)
    env["DPOOL_XDIST_TEST_MARK"] = mark
    env.update(extra)
    return env


def run_pytest(cwd: Path, *args: str, tmp_path: Path, env: dict | None = None,
               timeout: float = TIMEOUT) -> Run:
    mark = uuid.uuid4().hex
    tmpdir = tmp_path / f"tmp-{mark[:8]}"
    tmpdir.mkdir()
    env = env or inner_env(tmpdir, mark)
    env["TMPDIR"] = str(tmpdir)
    env["DPOOL_XDIST_TEST_MARK"] = mark
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:randomly",
         "-o", "addopts=", "-o", "timeout=60", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    run = Run(proc, mark, tmpdir)
    assert_nothing_left(run)
    return run


def marked_processes(mark: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("DPOOL_XDIST_TEST_MARK") == mark and \
                    p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def assert_nothing_left(run: Run, wait: float = 10.0) -> None:
    """No process of the run is alive, no listener directory is left in its TMPDIR."""
    deadline = time.monotonic() + wait
    left = marked_processes(run.mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_processes(run.mark)
    cmdlines = []
    for p in left:
        try:
            cmdlines.append(" ".join(p.cmdline()))
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"processes left behind: {cmdlines}\n{run.out[-2000:]}"
    leftovers = [p.name for p in run.tmpdir.iterdir() if p.name.startswith("dpool-xdist")]
    assert not leftovers, leftovers


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    return write_suite(tmp_path / "suite", SUITE)


EXPECTED = {"passed": 18, "failed": 2, "skipped": 1, "xfailed": 1, "xpassed": 1, "error": 1}


@pytest.mark.timeout(TIMEOUT)
def test_same_counts_and_junit_as_plain_xdist(suite: Path, tmp_path: Path) -> None:
    plain = run_pytest(suite, "-n", "2", "--junitxml=plain.xml", tmp_path=tmp_path)
    ours = run_pytest(suite, "-n", "2", "--dpool", "--junitxml=ours.xml", tmp_path=tmp_path)
    assert plain.counts() == EXPECTED, plain.out[-3000:]
    assert ours.counts() == EXPECTED, ours.out[-3000:]
    assert plain.proc.returncode == ours.proc.returncode == 1

    def junit(name: str) -> dict:
        root = ET.parse(suite / name).getroot()
        cases = {}
        for case in root.iter("testcase"):
            outcome = next((c.tag for c in case if c.tag in
                            ("failure", "error", "skipped")), "passed")
            cases[f"{case.get('classname')}::{case.get('name')}"] = outcome
        return cases

    assert junit("ours.xml") == junit("plain.xml")
    # captured output of a failing test reaches the report
    assert "this is printed" in ours.out


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("dist", ["loadscope", "loadfile", "loadgroup", "worksteal"])
def test_dist_modes(suite: Path, tmp_path: Path, dist: str) -> None:
    ours = run_pytest(suite, "-n", "2", "--dpool", f"--dist={dist}", tmp_path=tmp_path)
    assert ours.counts() == EXPECTED, ours.out[-3000:]


@pytest.mark.timeout(TIMEOUT)
def test_k_and_m_select_as_plain(suite: Path, tmp_path: Path) -> None:
    for args in (["-k", "pass or TestA"], ["-m", "slow"], ["-m", "not slow", "-k", "b"]):
        plain = run_pytest(suite, "-n", "2", *args, tmp_path=tmp_path)
        ours = run_pytest(suite, "-n", "2", "--dpool", *args, tmp_path=tmp_path)
        assert ours.counts() == plain.counts(), (args, ours.out[-2000:])


@pytest.mark.timeout(TIMEOUT)
def test_exitfirst_stops_and_leaves_nothing(suite: Path, tmp_path: Path) -> None:
    plain = run_pytest(suite, "-n", "2", "-x", tmp_path=tmp_path)
    ours = run_pytest(suite, "-n", "2", "--dpool", "-x", tmp_path=tmp_path)
    assert ours.proc.returncode == plain.proc.returncode != 0
    assert "stopping after 1 failures" in ours.out
    counts = ours.counts()
    assert counts.get("failed", 0) + counts.get("error", 0) >= 1
    assert sum(counts.values()) < sum(EXPECTED.values()), ours.out[-2000:]


@pytest.mark.timeout(TIMEOUT)
def test_last_failed(suite: Path, tmp_path: Path) -> None:
    cache = ["-o", f"cache_dir={tmp_path / 'cache'}"]
    first = run_pytest(suite, "-n", "2", "--dpool", *cache, tmp_path=tmp_path)
    assert first.counts() == EXPECTED
    again = run_pytest(suite, "-n", "2", "--dpool", "--lf", *cache, tmp_path=tmp_path)
    counts = again.counts()
    assert counts.get("failed") == 2 and counts.get("error") == 1, again.out[-2000:]
    assert "passed" not in counts


@pytest.mark.timeout(TIMEOUT)
def test_crashing_test_is_reported_and_worker_replaced(tmp_path: Path) -> None:
    where = write_suite(tmp_path / "crash", {"test_crash.py": CRASH})
    plain = run_pytest(where, "-n", "2", tmp_path=tmp_path)
    ours = run_pytest(where, "-n", "2", "--dpool", tmp_path=tmp_path)
    assert ours.counts() == plain.counts() == {"passed": 3, "failed": 1}
    assert "crashed while running 'test_crash.py::test_crash'" in ours.out
    assert "replacing crashed worker" in ours.out


@pytest.mark.timeout(TIMEOUT)
def test_max_worker_restart_honoured(tmp_path: Path) -> None:
    where = write_suite(tmp_path / "crash", {"test_crash.py": CRASH + '''
    def test_crash_again():
        os._exit(1)
    '''})
    plain = run_pytest(where, "-n", "2", "--max-worker-restart=1", tmp_path=tmp_path)
    ours = run_pytest(where, "-n", "2", "--dpool", "--max-worker-restart=1",
                      tmp_path=tmp_path)
    assert "maximum crashed workers reached: 1" in plain.out
    assert "maximum crashed workers reached: 1" in ours.out, ours.out[-3000:]
    assert ours.proc.returncode == plain.proc.returncode != 0


@pytest.mark.timeout(TIMEOUT)
def test_without_dpool_nothing_changes(suite: Path, tmp_path: Path) -> None:
    (suite / "conftest.py").write_text(textwrap.dedent('''
        import sys

        def pytest_sessionfinish(session):
            if not hasattr(session.config, "workerinput"):
                heavy = sorted(m for m in ("dpool.executor", "dpool.runtime",
                                           "dpool.testing._controller") if m in sys.modules)
                print("DPOOL-MODULES", heavy)
    '''))
    run = run_pytest(suite, "-n", "2", "-s", tmp_path=tmp_path)
    assert run.counts() == EXPECTED
    assert "DPOOL-MODULES []" in run.out, run.out[-2000:]
    assert "dpool" not in "".join(
        ln for ln in run.out.splitlines() if "warning" in ln.lower())
    serial = run_pytest(suite, "-p", "no:xdist", "-q", tmp_path=tmp_path)
    assert serial.counts() == EXPECTED


@pytest.mark.timeout(TIMEOUT)
def test_dpool_without_n_warns(suite: Path, tmp_path: Path) -> None:
    run = run_pytest(suite, "--dpool", tmp_path=tmp_path)
    assert run.counts() == EXPECTED
    assert "--dpool has no effect without -n" in run.out


@pytest.mark.timeout(TIMEOUT)
def test_tx_specs_are_refused(suite: Path, tmp_path: Path) -> None:
    run = run_pytest(suite, "--dist", "load", "--tx", f"popen//python={sys.executable}",
                     "--dpool", tmp_path=tmp_path)
    assert run.proc.returncode == 4 and "use -n N instead of --tx" in run.out


@pytest.mark.timeout(TIMEOUT)
def test_resources_option_is_validated(suite: Path, tmp_path: Path) -> None:
    bad = run_pytest(suite, "-n", "2", "--dpool", "--dpool-resources", "{GPU: 1}",
                     tmp_path=tmp_path)
    assert bad.proc.returncode == 4 and "--dpool-resources is not JSON" in bad.out
    neg = run_pytest(suite, "-n", "2", "--dpool", "--dpool-resources", '{"GPU": -1}',
                     tmp_path=tmp_path)
    assert neg.proc.returncode == 4 and "must be a positive number" in neg.out
    import inspect

    from dpool import ProcessPoolExecutor

    ok = run_pytest(suite, "-n", "2", "--dpool", "--dpool-resources", '{"CPU": 1}',
                    tmp_path=tmp_path)
    if "resources" in inspect.signature(ProcessPoolExecutor).parameters:
        assert ok.counts() == EXPECTED, ok.out[-2000:]
    else:
        assert ok.proc.returncode == 4 and "accepts resources=" in ok.out


@pytest.mark.timeout(TIMEOUT)
def test_auto_is_dpool_cpu_count(suite: Path, tmp_path: Path) -> None:
    import dpool

    run = run_pytest(suite, "-n", "auto", "--dpool", tmp_path=tmp_path)
    assert run.counts() == EXPECTED
    assert f"created: {dpool.cpu_count()}/{dpool.cpu_count()} workers" in run.out, \
        run.out[:2000]


@pytest.mark.timeout(TIMEOUT)
def test_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    where = write_suite(tmp_path / "slow", {"test_slow.py": '''
        import os, time, pytest

        @pytest.mark.parametrize("i", range(4))
        def test_slow(i):
            open(os.path.join(os.environ["STARTED_DIR"], str(os.getpid())), "w").close()
            time.sleep(60)
    '''})
    started = tmp_path / "started"
    started.mkdir()
    mark = uuid.uuid4().hex
    tmpdir = tmp_path / "tmp-ctrlc"
    tmpdir.mkdir()
    env = inner_env(tmpdir, mark, STARTED_DIR=str(started))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *plugin_args(), "-o", "addopts=", "-n", "2",
         "--dpool", "-p", "no:cacheprovider"],
        cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(started.iterdir())) >= 2
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "KeyboardInterrupt" in out or "Interrupted" in out, out[-2000:]
    assert_nothing_left(Run(subprocess.CompletedProcess([], proc.returncode, out, ""),
                            mark, tmpdir), wait=15)


def test_bridge_handshake_is_dpools() -> None:
    """The bridge restates dpool's handshake (it imports no dpool): they must agree."""
    sys.path.insert(0, str(ROOT / "dpool" / "testing"))
    try:
        import _bridge  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    assert _bridge.MAGIC == _auth.MAGIC
    token = os.urandom(32)
    for client_token, ok in ((token, True), (os.urandom(32), False)):
        a, b = socket.socketpair()
        errors: list = []

        def serve(sock: socket.socket = a, errors: list = errors) -> None:
            try:
                _auth.server_handshake(sock, token)
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        t = threading.Thread(target=serve)
        t.start()
        try:
            _bridge.handshake(b, client_token, json.dumps(_auth.build()).encode())
            assert ok
        except OSError:
            assert not ok
        t.join(10)
        assert bool(errors) != ok
        a.close()
        b.close()


def test_unauthenticated_peer_is_refused(tmp_path: Path) -> None:
    """A process without the run's token gets nothing from the controller's listener."""
    from dpool.testing._controller import Backend

    backend = Backend(str(tmp_path), None, 5.0, None)
    backend.start(1)
    try:
        assert backend.rundir is not None
        assert oct(os.stat(backend.rundir).st_mode & 0o777) == "0o700"
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(os.path.join(backend.rundir, "s"))
        with pytest.raises(dpool_auth_error()):
            _auth.client_handshake(sock, os.urandom(32), "controller", timeout=5)
        sock.close()
    finally:
        backend.close()
    assert not os.path.exists(backend.rundir)


def test_local_root_finds_the_shipped_copy(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """On a node the dpool worker runs in the copy (its cwd mapped into it): the test
    worker's root is the copy that holds the marker file, never a look-alike."""
    from dpool.testing._task import local_root

    root, copy = tmp_path / "orig", tmp_path / "copy"
    for d in (root, copy):
        (d / "sub").mkdir(parents=True)
    (copy / "tests.py").write_text("")
    monkeypatch.chdir(copy / "sub")
    assert local_root(str(root), "sub", "tests.py") == str(copy)
    monkeypatch.chdir(root / "sub")  # a cwd that is not the copy: the marker decides
    (root / "tests.py").write_text("")
    assert local_root(str(root), "sub", "tests.py") == str(root)
    with pytest.raises(FileNotFoundError, match="not on node"):
        local_root(str(root), "sub", "missing.py")


def test_resources_reach_an_executor_that_takes_them(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the executor accepts ``resources=`` (per-task resources, being added), the
    backend passes ``--dpool-resources`` through; here a stand-in executor records it."""
    import dpool.executor
    from dpool.testing._controller import Backend

    seen: list = []

    class WithResources(dpool.executor.ProcessPoolExecutor):
        def __init__(self, *args: object, resources: dict | None = None,
                     **kwargs: object) -> None:
            seen.append(resources)
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dpool.executor, "ProcessPoolExecutor", WithResources)
    backend = Backend(str(tmp_path), {"GPU": 1}, 5.0, None)
    backend.start(1)
    backend.close()
    assert seen == [{"GPU": 1}]


def test_killed_controllers_directory_is_removed_by_the_next_run(tmp_path: Path) -> None:
    from dpool.testing._controller import _reap_rundirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"dpool-xdist-{dead.pid}-abc"
    alive = tmp_path / f"dpool-xdist-{os.getpid()}-def"
    other = tmp_path / "dpool-xdist-notapid-x"
    for d in (gone, alive, other):
        d.mkdir()
    _reap_rundirs(str(tmp_path))
    assert not gone.exists() and alive.exists() and other.exists()


def workers_under(path: Path) -> list[int]:
    """Test workers (``$DPOOL_XDIST_ROOT`` set by their task) running from under ``path``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("DPOOL_XDIST_ROOT", "").startswith(str(path)) and \
                    p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def dpool_auth_error() -> type:
    from dpool.errors import AuthenticationError

    return AuthenticationError


# -- cluster mode: three node daemons on loopback ---------------------------------------

@pytest.mark.timeout(240)
def test_cluster_same_counts_from_shipped_copy(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    from tests.cluster.conftest import start_cluster, stop_cluster

    where = write_suite(tmp_path / "project", {**SUITE, "test_where.py": '''
        import os

        def test_where():
            print("RAN-IN", os.environ.get("DPOOL_NODE_ID"), __file__)
    '''})
    expected = dict(EXPECTED, passed=EXPECTED["passed"] + 1)
    plain = run_pytest(where, "-n", "2", tmp_path=tmp_path)
    assert plain.counts() == expected
    c = start_cluster(tmp_path / "cluster", 3, head_cpus=2, cpus=2)
    try:
        mark = uuid.uuid4().hex
        tmpdir = tmp_path / "tmp-cluster"
        tmpdir.mkdir()
        env = inner_env(tmpdir, mark, DPOOL_ADDRESS=c.address, DPOOL_TOKEN=c.token)
        ours = run_pytest(where, "-n", "auto", "--dpool", "-rA", "-p", "no:cacheprovider",
                          tmp_path=tmp_path, env=env, timeout=180)
        assert ours.counts() == expected, ours.out[-3000:]
        assert "created: 6/6 workers" in ours.out
        ran = re.findall(r"RAN-IN (\S+) (\S+)", ours.out)
        assert ran, ours.out[-3000:]
        # the test file ran from a node's unpacked copy of the project, not from here
        assert all("workdirs" in path and not path.startswith(str(where))
                   for _, path in ran), ran
        # the test workers on the nodes (which do not carry the run's mark) are gone too
        deadline = time.monotonic() + 10
        while workers_under(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not workers_under(tmp_path)
        # tests in a directory that is not shipped (a virtual environment): a usage error
        venv = where / "env"
        venv.mkdir()
        (venv / "pyvenv.cfg").write_text("")
        (venv / "test_in_venv.py").write_text("def test_x():\n    pass\n")
        refused = run_pytest(where, "-n", "2", "--dpool", "env/test_in_venv.py",
                             tmp_path=tmp_path, env=env)
        assert refused.proc.returncode == 4, refused.out[-2000:]
        assert "dpool skips virtual environments" in refused.out
        too_many = run_pytest(where, "-n", "7", "--dpool", tmp_path=tmp_path, env=env)
        assert too_many.proc.returncode == 4 and "more test workers than the cluster has " \
            "CPUs (6)" in too_many.out, too_many.out[-2000:]
    finally:
        stop_cluster(c)
