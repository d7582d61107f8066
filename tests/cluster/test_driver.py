"""Drivers on a one-node cluster: unchanged stdlib programs, dpool's extras, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.cluster.conftest import TIMEOUT, base_env, dpool_cli, free_port, host, running

PPE_SCRIPT = textwrap.dedent("""
    import concurrent.futures as cf
    import os, sys, time
    from concurrent.futures import ProcessPoolExecutor

    def square(x):
        return x * x

    def where(_):
        time.sleep(0.01)
        return os.environ.get("DPOOL_NODE_ID")

    def boom(x):
        raise ValueError(f"bad {x}")

    if __name__ == "__main__":
        with ProcessPoolExecutor(max_workers=2) as ex:
            print(list(ex.map(square, range(20))))
            print(sum(ex.map(square, range(1000), chunksize=50)))
            fs = [ex.submit(square, i) for i in range(10)]
            print(sorted(f.result() for f in cf.as_completed(fs, timeout=30)))
            try:
                ex.submit(boom, 3).result()
            except ValueError as e:
                print("ValueError", e, "Traceback" in str(e.__cause__))
            slow = ex.submit(time.sleep, 1.0)
            done, not_done = cf.wait([slow], timeout=0.05)
            print(len(done), len(not_done))
            try:
                slow.result(timeout=0.01)
            except cf.TimeoutError:
                print("timeout")
            print(slow.result(timeout=30))
            sys.stderr.write("nodes %s\\n" % sorted(set(map(str, ex.map(where, range(8))))))
""")

POOL_SCRIPT = textwrap.dedent("""
    import multiprocessing

    def cube(x):
        return x ** 3

    if __name__ == "__main__":
        with multiprocessing.Pool(2) as p:
            print(p.map(cube, range(10)))
            print(sorted(p.imap_unordered(cube, range(10))))
            print(p.starmap(pow, [(2, 3), (3, 2)]))
            r = p.apply_async(cube, (4,))
            print(r.get(timeout=30))
""")


def _stdlib(script: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "stdlib_script.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=base_env(),
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


def _on_dpool(cluster, script: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "dpool_script.py"
    path.write_text(script)
    return subprocess.run([sys.executable, "-m", "dpool", "run", str(path)], cwd=tmp_path,
                          env=cluster.driver_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)


def test_unchanged_executor_script_gives_the_stdlibs_results(cluster, tmp_path):
    ours = _on_dpool(cluster, PPE_SCRIPT, tmp_path)
    theirs = _stdlib(PPE_SCRIPT, tmp_path)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout
    assert f"nodes ['{cluster.head.address}']" in ours.stderr  # it really ran on the node


def test_unchanged_pool_script_gives_the_stdlibs_results(cluster, tmp_path):
    ours = _on_dpool(cluster, POOL_SCRIPT, tmp_path)
    theirs = _stdlib(POOL_SCRIPT, tmp_path)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout


def test_dpool_extras_on_the_cluster(cluster, tmp_path):
    code = textwrap.dedent("""
        import os
        import numpy as np
        import dpool

        def nested(n):
            ex = dpool.get_executor()
            return sum(f.result() for f in [ex.submit(lambda i: i * 2, i) for i in range(n)])

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                print(dpool.cpu_count(), ex._max_workers)
                a = ex.submit(lambda: 20)
                b = ex.submit(lambda x: x + 1, a)          # a future as an argument
                print(b.result())
                print(ex.submit(nested, 5).result())         # tasks that submit tasks
                ref = dpool.put(np.arange(1_000_000, dtype=np.int64))   # 8 MB
                print(ex.submit(lambda arr: int(arr.sum()), ref).result())
                big = ex.submit(np.ones, (1000, 1000)).result()         # a large result
                print(big.shape, float(big.sum()))
                fs = [ex.submit(lambda i: i, i) for i in range(10)]
                done, rest = dpool.wait(fs, num_returns=3, timeout=30)
                print(len(done) >= 3, sorted(dpool.get(fs)))
                print(dpool.get(ref)[-1])
                print(dpool.node_id() == ex.submit(dpool.node_id).result() != "local")
    """)
    out = cluster.run_script(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "2 2", "21", "20", str(sum(range(1_000_000))), "(1000, 1000) 1000000.0",
        f"True {list(range(10))}", "999999", "True"]


def test_failures_are_typed_and_the_pool_stays_usable(cluster, tmp_path):
    code = textwrap.dedent("""
        import os, threading
        from concurrent.futures.process import BrokenProcessPool
        import dpool

        def init():
            raise RuntimeError("no init")

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(1, initializer=init) as ex:
                try:
                    ex.submit(abs, 1).result(timeout=30)
                except BrokenProcessPool as e:
                    print("broken", "RuntimeError" in str(e))
            with dpool.ProcessPoolExecutor(1) as ex:
                f = ex.submit(lambda: threading.Lock())    # an unpicklable result
                try:
                    f.result(timeout=30)
                except TypeError as e:
                    print("TypeError")
                try:
                    ex.submit(abs, threading.Lock()).result()   # an unpicklable argument
                except TypeError:
                    print("TypeError")
                f = ex.submit(os._exit, 3)                       # a worker dies each time
                try:
                    f.result(timeout=30)
                except dpool.WorkerCrashedError as e:
                    print("crashed", e.attempts)
                print(ex.submit(abs, -5).result(timeout=30))
                slow = [ex.submit(__import__("time").sleep, 0.3) for _ in range(5)]
                ex.shutdown(wait=True, cancel_futures=True)
                print(sum(f.cancelled() for f in slow) >= 3, all(f.done() for f in slow))
    """)
    out = cluster.run_script(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "broken True", "TypeError", "TypeError", "crashed 3", "5", "True True"]


def test_locks_and_queues_in_initargs_are_refused_at_once(cluster, tmp_path):
    """The node daemons start the workers, on other hosts too: objects that only process
    creation can hand over fail at the constructor, typed (DIFFERENCES.md)."""
    code = textwrap.dedent("""
        import multiprocessing
        import dpool

        if __name__ == "__main__":
            for make in (lambda: dpool.ProcessPoolExecutor(1, initializer=print,
                                                           initargs=(multiprocessing.Lock(),)),
                         lambda: dpool.Pool(1, initializer=print,
                                            initargs=(multiprocessing.Queue(),))):
                try:
                    make()
                except dpool.SerializationError as e:
                    print("refused", "Manager" in str(e))
            with dpool.ProcessPoolExecutor(1, initializer=print, initargs=("ok",)) as ex:
                print(ex.submit(abs, -2).result(timeout=30))
    """)
    out = cluster.run_script(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert [x for x in out.stdout.splitlines() if x != "ok"] == [
        "refused True", "refused True", "2"]


def test_wrong_token_is_refused_and_the_node_keeps_serving(cluster, tmp_path):
    code = "import dpool\nprint(dpool.ProcessPoolExecutor(1).submit(abs, -1).result())\n"
    out = cluster.run_script(code, tmp_path, env=cluster.driver_env(DPOOL_TOKEN="wrong"))
    assert out.returncode != 0
    assert "dpool.errors.AuthenticationError" in out.stderr and "DPOOL_TOKEN" in out.stderr
    log = open(os.path.join(cluster.head.state_dir, "node.log")).read()
    assert "refused a connection" in log
    out = cluster.run_script(code, tmp_path)
    assert out.returncode == 0 and out.stdout == "1\n", out.stderr


def test_a_raw_peer_without_the_token_gets_nothing_unpickled(cluster):
    import pickle
    import socket

    host, port = cluster.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        hello = s.recv(40)
        assert hello.startswith(b"DPOOL")
        # a pickle that would create a file if the node ever unpickled it
        s.sendall(b"\x00" * 64 + pickle.dumps(print))
        assert s.recv(2) == b"NO"


@pytest.mark.parametrize("address, expect", [
    ("127.0.0.1:{port}", "cannot reach"),   # nothing listens there
    ("not-an-address", "is not HOST:PORT"),
    ("127.0.0.1:99999", "out of range"),
])
def test_bad_addresses_fail_clearly_and_quickly(address, expect, tmp_path):
    env = base_env()
    env.update(DPOOL_ADDRESS=address.format(port=free_port()), DPOOL_TOKEN="t")
    code = "from dpool import ProcessPoolExecutor\nProcessPoolExecutor(1)\n"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=TIMEOUT, check=False)
    assert time.monotonic() - t0 < 10
    assert out.returncode != 0
    assert "dpool.errors.Error" in out.stderr and expect in out.stderr


def test_status_json_describes_the_node(cluster):
    env = base_env()
    env["DPOOL_STATE_DIR"] = cluster.head.state_dir
    out = dpool_cli(["status", "--json"], env)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    (node,) = status["nodes"]
    assert node["node_id"] == cluster.head.address
    assert node["alive"] and node["cpus_total"] == 2
    out = dpool_cli(["status"], env)
    assert cluster.head.address in out.stdout and "CPUs used/total" in out.stdout


def test_a_killed_driver_leaves_nothing_on_the_node(cluster, tmp_path):
    code = textwrap.dedent("""
        import sys, time
        import numpy as np
        import dpool
        ex = dpool.ProcessPoolExecutor(2)
        refs = [dpool.put(np.ones(1 << 20)) for _ in range(3)]          # 8 MB each
        fs = [ex.submit(np.ones, 1 << 20) for _ in range(3)]
        [f.result() for f in fs]
        busy = [ex.submit(time.sleep, 60) for _ in range(2)]
        print("ready", flush=True)
        time.sleep(120)
    """)
    script = tmp_path / "victim.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script)], env=cluster.driver_env(),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        node = psutil.Process(cluster.head.pid)
        def node_workers() -> list:  # (the node's fork server is its child, not a worker)
            return [c for c in node.children(recursive=True)
                    if running(c.pid) and c.name() != "dpool-zygote"]

        assert len(node_workers()) >= 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            workers = node_workers()
            segments = [n for n in os.listdir("/dev/shm") if n.startswith(f"dpool_{node.pid}_")
                        and not n.endswith("_pool")]
            if not workers and not segments:
                break
            time.sleep(0.1)
        assert not workers and not segments
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_node_fails_the_drivers_futures_without_a_hang(tmp_path):
    from tests.cluster.conftest import start_node

    node, token = start_node(tmp_path, host(3), head=True)
    try:
        env = base_env()
        env.update(DPOOL_ADDRESS=node.address, DPOOL_TOKEN=token)
        code = textwrap.dedent(f"""
            import os, signal, time
            from concurrent.futures.process import BrokenProcessPool
            import dpool
            ex = dpool.ProcessPoolExecutor(2)
            fs = [ex.submit(time.sleep, 30) for _ in range(4)]
            time.sleep(0.5)
            os.kill({node.pid}, signal.SIGKILL)
            for f in fs:
                try:
                    f.result(timeout=20)
                except BrokenProcessPool as e:
                    print(type(e).__name__)
            try:
                ex.submit(abs, 1)
            except BrokenProcessPool:
                print("submit refused")
        """)
        path = tmp_path / "d.py"
        path.write_text(code)
        out = subprocess.run([sys.executable, str(path)], env=env, capture_output=True,
                             text=True, timeout=TIMEOUT, check=False)
        assert out.stdout.splitlines() == ["NodeLostError"] * 4 + ["submit refused"], out.stderr
    finally:
        node.stop()
        from dpool.objects import _segment

        _segment.reap_orphans()  # the killed node's segments (dpool stop does this too)


def test_stop_leaves_nothing_behind(tmp_path):
    from tests.cluster.conftest import start_node

    node, token = start_node(tmp_path, host(4), head=True)
    env = base_env()
    env.update(DPOOL_ADDRESS=node.address, DPOOL_TOKEN=token)
    out = subprocess.run([sys.executable, "-c", "import dpool, numpy as np\n"
                          "ex = dpool.ProcessPoolExecutor(2)\n"
                          "print(ex.submit(np.ones, 1 << 20).result().sum())\n"],
                         env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.stdout.strip() == "1048576.0", out.stderr
    pids = [node.pid, *(c.pid for c in psutil.Process(node.pid).children(recursive=True))]
    out = dpool_cli(["stop"], node.env)
    assert out.returncode == 0 and node.address in out.stdout
    assert not [p for p in pids if running(p)]
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"dpool_{node.pid}_")]
    assert not os.path.exists(os.path.join(node.state_dir, "cluster.json"))
    assert not os.path.exists(os.path.join(node.state_dir, "node.sock"))


def test_cli_errors(tmp_path):
    env = base_env()
    env["DPOOL_STATE_DIR"] = str(tmp_path / "s")
    out = dpool_cli(["start", "--bogus"], env)
    assert out.returncode == 2 and "usage" in out.stderr
    out = dpool_cli(["start", "--address", "127.0.0.1:1"], env)
    assert out.returncode == 2 and "token" in out.stderr
    port = free_port(host(5))
    with __import__("socket").create_server((host(5), port)):
        out = dpool_cli(["start", "--head", "--port", str(port), "--node-ip", host(5)], env)
    assert out.returncode == 1 and "Address already in use" in out.stderr
    out = dpool_cli(["status"], env)
    assert out.returncode == 1 and "no cluster was started" in out.stderr
    out = dpool_cli(["stop"], env)
    assert out.returncode == 0 and "nothing" in out.stdout


def test_a_head_on_an_existing_redis(tmp_path, shards):
    """``dpool start --head --redis-address``: no shards of its own; stop leaves the
    user's Redis running."""
    from tests.cluster.conftest import start_node

    addresses, password, servers = shards
    node, token = start_node(tmp_path, host(6), head=True,
                             extra=("--redis-address", ",".join(addresses), "--token", password))
    try:
        assert token == password
        assert node.record["redis"] == []
        env = base_env()
        env.update(DPOOL_ADDRESS=node.address, DPOOL_TOKEN=token)
        out = subprocess.run([sys.executable, "-c", "import dpool\n"
                              "print(dpool.ProcessPoolExecutor(2).submit(abs, -3).result())\n"],
                             env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert out.stdout.strip() == "3", out.stderr
        status = json.loads(dpool_cli(["status", "--json"], node.env).stdout)
        assert [s["address"] for s in status["shards"]] == addresses
    finally:
        node.stop()
    assert all(s.running() for s in servers)


def test_a_state_dir_others_can_write_is_refused(tmp_path):
    """Under a shared /tmp another user could plant a record (their address and token):
    dpool refuses a state dir that is not private to this user."""
    state = tmp_path / "shared"
    state.mkdir()
    state.chmod(0o777)
    env = base_env()
    env["DPOOL_STATE_DIR"] = str(state)
    out = dpool_cli(["start", "--head", "--port", str(free_port(host(7), span=12)),
                     "--node-ip", host(7)], env)
    assert out.returncode == 1 and "not a private directory" in out.stderr
    (state / "cluster.json").write_text(f'{{"address": "{host(7)}:1", "token": "theirs"}}')
    env.update(DPOOL_ADDRESS="auto")
    run = subprocess.run([sys.executable, "-c", "import dpool\ndpool.ProcessPoolExecutor(1)\n"],
                         env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode != 0 and "not a private directory" in run.stderr


def test_a_driver_on_its_nodes_host_shares_its_store_zero_copy(cluster, tmp_path):
    """Attached over the unix socket, large values go straight into the node's store and
    results are mapped in place; over TCP they travel inline. Both give the same values."""
    code = textwrap.dedent("""
        import os, sys
        import numpy as np
        import dpool

        def shm_backed(arr):
            addr = arr.__array_interface__["data"][0]
            for line in open("/proc/self/maps"):
                span, *rest = line.split()
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= addr < hi:
                    return rest[-1] if rest[-1].startswith("/dev/shm/") else "heap"
            return "?"

        if __name__ == "__main__":
            ex = dpool.ProcessPoolExecutor(2)
            big = np.arange(8_000_000, dtype=np.int64)                  # 64 MB
            ref = dpool.put(big)
            sums = [ex.submit(lambda a: int(a.sum()), ref) for _ in range(8)]
            print(all(f.result() == int(big.sum()) for f in sums))
            out = ex.submit(lambda n: np.full(n, 7, dtype=np.int32), 4_000_000).result()
            print(out.shape, int(out.sum()), out.flags.writeable)
            print(shm_backed(out).split("_")[1] if "dpool" in shm_backed(out) else "copied")
            out[0] = 1                                                  # copy-on-write
            print(int(ex.submit(lambda a: int(a[0]), big).result()))
            ex.shutdown()
    """)
    local = cluster.run_script(code, tmp_path, env=cluster.driver_env(
        DPOOL_STATE_DIR=cluster.head.state_dir))
    assert local.returncode == 0, local.stderr
    assert local.stdout.splitlines() == [
        "True", "(4000000,) 28000000 True", str(cluster.head.pid), "0"]
    remote = cluster.run_script(code, tmp_path)  # over TCP: the same values, copied
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.splitlines() == ["True", "(4000000,) 28000000 True", "copied", "0"]


def test_a_closing_driver_says_nothing_about_its_own_connection(cluster, tmp_path):
    """Issue 31: after a program's traceback, a late flush of releases met the connection
    the exiting driver had shut itself and printed "lost the connection to node ...:
    Broken pipe". The event order, written down: the driver closes, then a send (the
    flusher's, or a release of a future collected late) goes out."""
    code = textwrap.dedent("""
        import dpool
        from dpool.runtime import _current

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                fs = [ex.submit(abs, -i) for i in range(20)]
                print(sum(f.result(timeout=30) for f in fs))
            drv = _current.driver()
            drv.close()
            try:
                drv.send([])  # what the flusher does with releases queued meanwhile
            except dpool.NodeLostError:
                print("closed")
            del fs  # their releases, after the close
            raise ValueError("the program's own error")
    """)
    out = cluster.run_script(code, tmp_path)
    assert out.returncode == 1 and out.stdout.split() == ["190", "closed"], out
    assert "ValueError: the program's own error" in out.stderr
    assert "lost the connection" not in out.stderr, out.stderr
