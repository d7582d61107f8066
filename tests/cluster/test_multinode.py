"""Three nodes on one machine (``host(2)``-``host(4)``, each its own store), a head with
Redis shards and global schedulers: unchanged programs spread over the nodes, and survive
failures."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import dpool
from tests.cluster.conftest import (
    TIMEOUT,
    base_env,
    dpool_cli,
    host,
    running,
    start_cluster,
    stop_cluster,
    wait_for_nodes,
)

SPREAD = textwrap.dedent("""
    import collections, os, sys, time
    from concurrent.futures import ProcessPoolExecutor, as_completed, wait

    def where(x):
        time.sleep(0.2)
        return x * x, os.environ.get("DPOOL_NODE_ID")

    if __name__ == "__main__":
        with ProcessPoolExecutor() as ex:
            fs = [ex.submit(where, i) for i in range(30)]
            done, not_done = wait(fs, timeout=0.01)
            print(len(done) < 30)
            results = [f.result(timeout=60) for f in as_completed(fs, timeout=60)]
            print(sorted(r for r, _ in results))
            nodes = collections.Counter(n for _, n in results)
            sys.stderr.write(f"NODES {dict(nodes)}\\n")
""")


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("c3"), n_nodes=3, global_schedulers=2)
    try:
        yield c
    finally:
        stop_cluster(c)


def _nodes_used(stderr: str) -> dict:
    line = [x for x in stderr.splitlines() if x.startswith("NODES ")][-1]
    return eval(line[6:])  # noqa: S307 - our own script's dict literal


def test_an_unchanged_executor_spreads_over_the_nodes(cluster3, tmp_path):
    out = cluster3.run_script(SPREAD, tmp_path, unchanged=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True", str(sorted(i * i for i in range(30)))]
    used = _nodes_used(out.stderr)
    assert len(used) >= 2, used  # spilled beyond the head's 2 CPUs
    assert set(used) <= {n.address for n in cluster3.nodes}


def test_a_nodes_workers_do_not_hold_its_listening_socket(cluster3, tmp_path):
    """A node SIGKILLed while its workers are still ending must refuse connections at
    once: a global scheduler probes a node whose link closed, and takes one whose
    address accepts for alive (then only its heartbeats, seconds later, tell)."""
    out = cluster3.run_script(SPREAD, tmp_path, unchanged=True)
    assert out.returncode == 0, out.stderr
    checked = []
    for n in cluster3.nodes:
        node = psutil.Process(n.pid)
        port = int(n.address.rsplit(":", 1)[1])
        assert [c for c in node.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        for child in node.children(recursive=True):
            try:
                held = [c for c in child.net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN]
            except psutil.NoSuchProcess:  # (a worker retiring as we look)
                continue
            assert held == [], (child.pid, held)
            checked.append(child.pid)
    assert len(checked) >= 2  # (the tasks ran on workers that are still there)


def test_cpu_count_is_the_clusters(cluster3, tmp_path):
    code = "import dpool, multiprocessing\nprint(dpool.cpu_count())\n" \
           "print(dpool.ProcessPoolExecutor()._max_workers)\n"
    out = cluster3.run_script(code, tmp_path)
    assert out.stdout.split() == ["6", "6"], out.stderr


def test_an_unchanged_pool_script_across_nodes(cluster3, tmp_path):
    code = textwrap.dedent("""
        import multiprocessing, os, time

        def f(x):
            time.sleep(0.05)
            return x * 2, os.environ.get("DPOOL_NODE_ID")

        if __name__ == "__main__":
            with multiprocessing.Pool(6) as p:
                out = p.map(f, range(60))
                print([v for v, _ in out])
                print(len({n for _, n in out}) >= 2)
                print(sorted(v for v, _ in p.imap_unordered(f, range(10))))
    """)
    path = tmp_path / "pool_script.py"
    path.write_text(code)
    out = subprocess.run([sys.executable, "-m", "dpool", "run", str(path)], cwd=tmp_path,
                         env=cluster3.driver_env(), capture_output=True, text=True,
                         timeout=TIMEOUT, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str([x * 2 for x in range(60)]), "True",
                                       str([x * 2 for x in range(10)])]


def test_nested_tasks_from_a_worker_on_another_node(cluster3, tmp_path):
    code = textwrap.dedent("""
        import os, time
        import dpool

        def leaf(i):
            return i + 1

        def parent(n):
            time.sleep(0.2)
            ex = dpool.get_executor()
            here = os.environ.get("DPOOL_NODE_ID")
            return here, sum(dpool.get([ex.submit(leaf, i) for i in range(n)]))

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor() as ex:
                out = [f.result(timeout=60) for f in [ex.submit(parent, 5) for _ in range(12)]]
                print({total for _, total in out})
                print(len({node for node, _ in out}) >= 2)
    """)
    out = cluster3.run_script(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["{15}", "True"]


def test_large_values_and_errors_cross_nodes_intact(cluster3, tmp_path):
    code = textwrap.dedent("""
        import os, time
        import numpy as np
        import dpool

        def work(a, i):
            time.sleep(0.1)
            if i == 7:
                raise KeyError("seven")
            return a * 2, os.environ.get("DPOOL_NODE_ID")

        if __name__ == "__main__":
            a = np.arange(2_000_000, dtype=np.float32).reshape(1000, 2000)[:, ::2]
            with dpool.ProcessPoolExecutor() as ex:
                fs = [ex.submit(work, a, i) for i in range(16)]
                nodes = set()
                for i, f in enumerate(fs):
                    try:
                        arr, node = f.result(timeout=60)
                        assert np.array_equal(arr, a * 2) and arr.dtype == np.float32
                        nodes.add(node)
                    except KeyError as e:
                        print("KeyError", i, "Traceback" in str(e.__cause__))
                print(len(nodes) >= 2)
    """)
    out = cluster3.run_script(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["KeyError 7 True", "True"]


def test_status_lists_every_node_scheduler_and_shard(cluster3):
    status = wait_for_nodes(cluster3, 3)
    assert {n["node_id"] for n in status["nodes"]} == {n.address for n in cluster3.nodes}
    assert all(n["alive"] and n["cpus_total"] == 2 for n in status["nodes"])
    assert len(status["global_schedulers"]) == 2
    assert all(g["alive"] for g in status["global_schedulers"])
    assert len(status["shards"]) == 2 and all(s["alive"] for s in status["shards"])
    env = base_env()
    env["DPOOL_STATE_DIR"] = cluster3.head.state_dir
    text = dpool_cli(["status"], env).stdout
    assert all(n.address in text for n in cluster3.nodes)


def test_a_killed_node_loses_no_future(tmp_path):
    c = start_cluster(tmp_path, n_nodes=3)
    try:
        victim = c.nodes[2]
        code = textwrap.dedent(f"""
            import os, signal, time
            from concurrent.futures import ProcessPoolExecutor, as_completed

            def slow(x):
                time.sleep(0.5)
                return x, os.environ.get("DPOOL_NODE_ID")

            if __name__ == "__main__":
                with ProcessPoolExecutor() as ex:
                    fs = [ex.submit(slow, i) for i in range(24)]
                    time.sleep(0.8)
                    os.kill({victim.pid}, signal.SIGKILL)
                    out = [f.result(timeout=90) for f in fs]
                    print(sorted(x for x, _ in out))
        """)
        out = c.run_script(code, tmp_path, timeout=120, unchanged=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(list(range(24)))
        deadline = time.monotonic() + 20
        for node in c.nodes[:2]:  # each survivor learns it (from its poll or the notice)
            path = os.path.join(node.state_dir, "node.log")

            def declared() -> bool:
                return any(victim.address in line and "declared dead" in line
                           for line in open(path))  # noqa: B023 - read while it waits

            while not declared() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert declared(), open(path).read()[-2000:]
    finally:
        stop_cluster(c)


def test_one_of_two_global_schedulers_killed_loses_no_task(tmp_path):
    c = start_cluster(tmp_path, n_nodes=3, global_schedulers=2)
    try:
        gs = c.head.record["global_schedulers"][0]["pid"]
        code = textwrap.dedent(f"""
            import os, signal, time
            from concurrent.futures import ProcessPoolExecutor

            def slow(x):
                time.sleep(0.3)
                return x, os.environ.get("DPOOL_NODE_ID")

            if __name__ == "__main__":
                with ProcessPoolExecutor() as ex:
                    first = [ex.submit(slow, i) for i in range(20)]
                    time.sleep(0.2)
                    os.kill({gs}, signal.SIGKILL)
                    later = [ex.submit(slow, i) for i in range(20, 40)]
                    out = [f.result(timeout=90) for f in first + later]
                    print(sorted(x for x, _ in out))
                    print(len({{n for _, n in out}}) >= 2)
        """)
        out = c.run_script(code, tmp_path, timeout=120, unchanged=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [str(list(range(40))), "True"]
    finally:
        stop_cluster(c)


def test_stop_on_every_host_leaves_nothing(tmp_path):
    c = start_cluster(tmp_path, n_nodes=2)
    pids = [n.pid for n in c.nodes]
    pids += [g["pid"] for g in c.head.record.get("global_schedulers", [])]
    pids += [r["pid"] for r in c.head.record.get("redis", [])]
    out = c.run_script("import dpool\nex = dpool.ProcessPoolExecutor()\n"
                       "print(sum(ex.map(abs, range(-50, 0))))\n", tmp_path)
    assert out.stdout.strip() == "1275", out.stderr
    children = []
    for p in pids:
        try:
            children += [x.pid for x in psutil.Process(p).children(recursive=True)]
        except psutil.Error:
            pass
    for n in reversed(c.nodes):
        assert dpool_cli(["stop"], n.env).returncode == 0
    gone = [p for p in pids + children if not running(p)]
    assert sorted(gone) == sorted(pids + children)
    assert not [s for s in os.listdir("/dev/shm")
                if any(s.startswith(f"dpool_{p}_") for p in pids)]


def test_what_tasks_print_reaches_the_drivers_terminal(cluster3, tmp_path):
    code = textwrap.dedent("""
        import logging, os, sys, time
        import dpool

        def chatty(i):
            time.sleep(0.2)
            print(f"out {i}")
            sys.stderr.write(f"err {i}\\n")
            logging.getLogger("user").warning("log %d", i)
            os.write(1, f"fd {i}\\n".encode())
            return os.environ["DPOOL_NODE_ID"], os.getpid()

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor() as ex:
                ran = [f.result(timeout=60) for f in [ex.submit(chatty, i) for i in range(12)]]
            for i, (node, pid) in enumerate(ran):
                sys.stderr.write(f"RAN {i} {node} {pid}\\n")
    """)
    out = cluster3.run_script(code, tmp_path)
    assert out.returncode == 0, out.stderr
    ran = {int(p[1]): (p[2], p[3]) for p in (x.split() for x in out.stderr.splitlines())
           if p and p[0] == "RAN"}
    assert len({node for node, _ in ran.values()}) >= 2
    for i, (node, pid) in ran.items():
        prefix = "" if node == cluster3.head.address else f"(pid={pid}, node={node}) "
        assert f"{prefix}out {i}" in out.stdout.splitlines()
        assert f"{prefix}fd {i}" in out.stdout.splitlines()
        assert f"{prefix}err {i}" in out.stderr.splitlines()
        assert f"{prefix}log {i}" in out.stderr.splitlines()


def test_a_node_that_stops_heartbeating_is_declared_dead_and_its_tasks_rerun(tmp_path):
    c = start_cluster(tmp_path, n_nodes=3)
    victim = c.nodes[2]
    try:
        code = textwrap.dedent("""
            import os, sys, time
            import dpool

            def slow(x):
                time.sleep(0.5)
                return x, os.environ.get("DPOOL_NODE_ID")

            if __name__ == "__main__":
                with dpool.ProcessPoolExecutor() as ex:
                    fs = [ex.submit(slow, i) for i in range(18)]
                    print("submitted", flush=True)
                    sys.stdin.readline()
                    out = [f.result(timeout=90) for f in fs]
                print(sorted(x for x, _ in out))
        """)
        script = tmp_path / "d.py"
        script.write_text(code)
        proc = subprocess.Popen([sys.executable, str(script)], env=c.driver_env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "submitted"
            time.sleep(0.3)
            family = [psutil.Process(victim.pid),
                      *psutil.Process(victim.pid).children(recursive=True)]
            for p in family:  # the node and its workers freeze: no heartbeat, no EOF
                p.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            out, _ = proc.communicate("go\n", timeout=120)
            assert out.strip().splitlines()[-1] == str(list(range(18)))
            assert time.monotonic() - t0 < 60
        finally:
            proc.kill()
            proc.wait()
        log = open(os.path.join(c.head.state_dir, "node.log")).read()
        # from its own poll ("stopped heartbeating") or another's notice
        assert any(f"node {victim.address} " in line and "declared dead" in line
                   for line in log.splitlines()), log[-2000:]
    finally:
        try:
            for p in [psutil.Process(victim.pid),
                      *psutil.Process(victim.pid).children(recursive=True)]:
                p.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass
        stop_cluster(c)


def test_a_killed_driver_releases_its_tasks_on_every_node(cluster3, tmp_path):
    """Its tasks running on other nodes stop too: their workers are gone within seconds."""
    pids = tmp_path / "pids"
    pids.mkdir()
    code = textwrap.dedent(f"""
        import os, time
        import dpool

        def sleepy(_):
            open(os.path.join({str(pids)!r}, str(os.getpid())), "w").write(
                os.environ["DPOOL_NODE_ID"])
            time.sleep(60)

        if __name__ == "__main__":
            ex = dpool.ProcessPoolExecutor()
            fs = [ex.submit(sleepy, i) for i in range(4)]   # 6 CPUs over three nodes
            time.sleep(120)
    """)
    script = tmp_path / "victim.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script)], env=cluster3.driver_env())
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(pids)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        running_pids = {int(p): (pids / p).read_text() for p in os.listdir(pids)}
        assert len(running_pids) == 4
        assert len(set(running_pids.values())) >= 2  # some ran on other nodes
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            alive = [p for p in running_pids if running(p)]
            if not alive:
                break
            time.sleep(0.1)
        assert not alive
    finally:
        proc.kill()
        proc.wait()


def test_the_drivers_own_modules_follow_its_tasks(cluster3, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "shipme.py").write_text(textwrap.dedent("""
        import os, time
        VERSION = 1

        def where(x):
            time.sleep(0.2)
            return x * VERSION, os.environ["DPOOL_NODE_ID"], __file__
    """))
    (project / ".git").mkdir()
    (project / ".git" / "big").write_bytes(b"x" * 1000)  # never shipped
    (project / "main.py").write_text(textwrap.dedent("""
        import sys
        import dpool
        import shipme

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor() as ex:
                for value, node, path in ex.map(shipme.where, range(18)):
                    print(value, node, path)
    """))
    env = cluster3.driver_env()

    def run() -> list:
        out = subprocess.run([sys.executable, "main.py"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=TIMEOUT)
        assert out.returncode == 0, out.stderr
        return [line.split() for line in out.stdout.splitlines()]

    rows = run()
    assert [int(v) for v, _, _ in rows] == list(range(18))
    remote = [(node, path) for _, node, path in rows if node != cluster3.head.address]
    assert remote  # some ran on the other nodes, which cannot import the project...
    for node, path in remote:  # ...but got a copy of it
        assert not path.startswith(str(project)) and "workdirs-" in path, path
        assert not os.path.exists(os.path.join(os.path.dirname(path), ".git"))
    (project / "shipme.py").write_text(
        (project / "shipme.py").read_text().replace("VERSION = 1", "VERSION = 3"))
    rows = run()  # the next run sees the change everywhere
    assert [int(v) for v, _, _ in rows] == [3 * i for i in range(18)]
    assert any(node != cluster3.head.address for _, node, _ in rows)


def test_a_working_dir_over_the_limit_says_how_to_fix_it(cluster3, tmp_path):
    (tmp_path / "data.bin").write_bytes(b"x" * 4096)
    env = cluster3.driver_env(DPOOL_WORKING_DIR_LIMIT="1000")
    out = subprocess.run([sys.executable, "-c", "import dpool\ndpool.ProcessPoolExecutor(1)\n"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode != 0
    assert "dpool.errors.Error" in out.stderr and "DPOOL_WORKING_DIR_LIMIT" in out.stderr
    env = cluster3.driver_env(DPOOL_WORKING_DIR_LIMIT="1000", DPOOL_WORKING_DIR="off")
    out = subprocess.run([sys.executable, "-c", "import dpool\n"
                          "print(dpool.ProcessPoolExecutor(1).submit(abs, -2).result())\n"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.stdout.strip() == "2", out.stderr


@pytest.fixture(scope="module")
def cluster_far(tmp_path_factory):
    """A head that runs nothing (0 CPUs) and two nodes: every task runs away from the
    driver's node, so every large input crosses between node stores."""
    c = start_cluster(tmp_path_factory.mktemp("far"), n_nodes=3, head_cpus=0)
    try:
        yield c
    finally:
        stop_cluster(c)


OBJECTS = textwrap.dedent("""
    import os
    import numpy as np
    import dpool

    def describe(*values):
        out = []
        for v in values:
            if isinstance(v, np.ndarray):
                out.append((v.dtype.str, v.shape, float(v.astype(np.float64).sum()),
                            v.flags.writeable))
            else:
                out.append(repr(v)[:60])
        return os.environ.get("DPOOL_NODE_ID"), out

    if __name__ == "__main__":
        rng = np.random.default_rng(0)
        big = rng.random(4_000_000)                                    # 32 MB float64
        ints = np.arange(3_000_000, dtype=np.int32).reshape(1000, 3000)
        fortran = np.asfortranarray(rng.random((1500, 1000)).astype(np.float32))
        strided = rng.random((2000, 2000))[:, ::3]
        nested = {"a": [np.ones(500_000), np.zeros(400_000, dtype=np.uint8)],
                  "b": (b"x" * 100, np.full(300_000, 7, dtype=np.int16))}
        expect = describe(big, ints, fortran, strided)[1]
        with dpool.ProcessPoolExecutor() as ex:
            ref = dpool.put(big)
            fs = [ex.submit(describe, ref, ints, fortran, strided) for _ in range(8)]
            nodes = set()
            for f in fs:
                node, got = f.result(timeout=60)
                assert got == expect, (got, expect)
                nodes.add(node)
            node, got = ex.submit(lambda d: (os.environ["DPOOL_NODE_ID"],
                                             float(sum(x.sum() for x in d["a"]))
                                             + float(d["b"][1].sum())), nested).result()
            assert got == 500_000 + 7 * 300_000, got
            back = ex.submit(lambda n: np.arange(n, dtype=np.float64), 5_000_000).result()
            assert back.shape == (5_000_000,) and back[-1] == 4_999_999.0
            print(len(nodes), sorted(nodes) == sorted(set(nodes)))
""")


@pytest.mark.parametrize("attach", ["unix", "tcp"])
def test_large_values_cross_node_stores_intact(cluster_far, tmp_path, attach):
    extra = {"DPOOL_STATE_DIR": cluster_far.head.state_dir} if attach == "unix" else {}
    out = cluster_far.run_script(OBJECTS, tmp_path, env=cluster_far.driver_env(**extra))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] in ("1", "2") and out.stdout.split()[1] == "True"


def _copies_sent(log: str) -> int:
    """Copies a node's log says it sent (a large one goes in ranges at once, a line each:
    the first is from offset 0)."""
    return len(re.findall(r"sent /dpool_\S+ to a node .* bytes from 0\)", open(log).read()))


def test_a_broadcast_input_crosses_once_per_node(cluster_far, tmp_path):
    code = textwrap.dedent("""
        import os, time
        import numpy as np
        import dpool

        def use(a, i):
            time.sleep(0.05)
            return os.environ["DPOOL_NODE_ID"], float(a[::1000].sum())

        if __name__ == "__main__":
            arr = np.arange(8_000_000, dtype=np.float64)               # 64 MB
            with dpool.ProcessPoolExecutor() as ex:
                ref = dpool.put(arr)
                out = [f.result(timeout=60) for f in [ex.submit(use, ref, i)
                                                      for i in range(16)]]
            assert {v for _, v in out} == {float(arr[::1000].sum())}
            print(len({n for n, _ in out}))
    """)
    log = os.path.join(cluster_far.head.state_dir, "node.log")
    before = _copies_sent(log)
    out = cluster_far.run_script(code, tmp_path, env=cluster_far.driver_env(
        DPOOL_STATE_DIR=cluster_far.head.state_dir))
    assert out.returncode == 0, out.stderr
    nodes = int(out.stdout.strip())
    sent = _copies_sent(log) - before
    assert 1 <= nodes <= 2 and sent == nodes  # 16 tasks, one copy per node that ran them


def test_placement_prefers_the_node_that_already_has_the_input(cluster_far, tmp_path):
    code = textwrap.dedent("""
        import os, time
        import numpy as np
        import dpool

        def where(a):
            return os.environ["DPOOL_NODE_ID"], float(a[::1000].sum())

        if __name__ == "__main__":
            arr = np.arange(8_000_000, dtype=np.float64)               # 64 MB
            with dpool.ProcessPoolExecutor() as ex:
                ref = dpool.put(arr)
                first = ex.submit(where, ref).result(timeout=60)[0]
                later = []
                for _ in range(5):  # one at a time: both nodes idle, one has a copy
                    time.sleep(0.3)                    # its load report says so
                    later.append(ex.submit(where, ref).result(timeout=60)[0])
            print(first, later.count(first))
    """)
    log = os.path.join(cluster_far.head.state_dir, "node.log")
    before = _copies_sent(log)
    out = cluster_far.run_script(code, tmp_path, env=cluster_far.driver_env(
        DPOOL_STATE_DIR=cluster_far.head.state_dir))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "5"
    assert _copies_sent(log) - before == 1


def test_the_object_table_lists_copies_and_a_reader_falls_back_to_them(cluster_far,
                                                                        tmp_path):
    """A node that copied an input is listed as a location of the object, serves its
    copy under the holder's segment name, and a fetch whose holder fails takes it from
    there."""
    from dpool.control._redis import RedisControlStore
    from dpool.objects import _segment
    from dpool.transfer import _pull

    code = textwrap.dedent("""
        import os, sys
        import numpy as np
        import dpool

        def where(a):
            return os.environ["DPOOL_NODE_ID"]

        if __name__ == "__main__":
            arr = np.arange(8_000_000, dtype=np.float64)               # 64 MB
            with dpool.ProcessPoolExecutor() as ex:
                ref = dpool.put(arr)
                print(ref.id, ex.submit(where, ref).result(timeout=60), flush=True)
                sys.stdin.readline()                      # the test reads the copies
    """)
    script = tmp_path / "driver_script.py"
    script.write_text(code)
    head = cluster_far.head
    driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                              env=cluster_far.driver_env(DPOOL_STATE_DIR=head.state_dir),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    store = RedisControlStore([r["address"] for r in head.record["redis"]],
                              cluster_far.token)
    made: list = []
    try:
        line = driver.stdout.readline().split()
        assert len(line) == 2, driver.communicate(timeout=TIMEOUT)
        oid, reader = int(line[0]), line[1]
        deadline = time.monotonic() + 10
        while store.object_locations(oid)[1] != {head.address, reader} and \
                time.monotonic() < deadline:
            time.sleep(0.05)  # (copies are recorded with the node's batched writes)
        assert store.object_locations(oid)[1] == {head.address, reader}
        name = _segment.segment_name(head.pid, oid)  # the holder's: the driver's node
        with open(os.path.join(_segment.SHM_DIR, name.lstrip("/")), "rb") as f:
            want = f.read()

        def copy(address: str, others=None) -> bytes:
            oid_here = 0x7000_0000 + len(made)
            made.append(_segment.segment_name(os.getpid(), oid_here))
            _pull.fetch(address, cluster_far.token.encode(), name, oid_here, os.getpid(),
                           len(want), timeout=10, others=others)
            with open(os.path.join(_segment.SHM_DIR, made[-1].lstrip("/")), "rb") as f:
                return f.read()

        assert copy(reader) == want  # the reader's copy, under the holder's name
        with socket.socket() as s:
            s.bind((host(2), 0))
            dead = f"{host(2)}:{s.getsockname()[1]}"  # nothing listens there
        with pytest.raises(dpool.ObjectLostError):
            copy(dead)
        assert copy(dead, others=lambda: sorted(store.object_locations(oid)[1])) == want
        driver.stdin.write("\n")
        driver.stdin.flush()
        _, err = driver.communicate(timeout=TIMEOUT)
        assert driver.returncode == 0, err
        deadline = time.monotonic() + 10
        while store.object_locations(oid)[1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.object_locations(oid)[1] == set()  # freed: no location left
    finally:
        for n in made:
            _segment.unlink(n)
        if driver.poll() is None:
            driver.kill()
            driver.communicate()


def _room_for(nbytes: int) -> bool:
    """Whether this machine has ``nbytes`` to spare in memory and in /dev/shm now."""
    from dpool.objects._segment import shm_free_bytes

    free = shm_free_bytes()
    return psutil.virtual_memory().available >= nbytes and (free is None or free >= nbytes)


# Three copies of 1 GB at once (the driver's array, the head's store, the reader's store),
# and some room for the nodes' stores (30% of memory by default): run where there is room.
@pytest.mark.skipif(not _room_for(5 << 30) or psutil.virtual_memory().total < 8 << 30,
                    reason="needs 8 GiB of memory and 5 GiB free in memory and /dev/shm")
@pytest.mark.timeout(240)
def test_a_1_gb_value_crosses_nodes_intact(cluster_far, tmp_path):
    code = textwrap.dedent("""
        import hashlib, os
        import numpy as np
        import dpool

        def digest(a):
            return os.environ["DPOOL_NODE_ID"], a.shape, hashlib.blake2b(a).hexdigest()

        if __name__ == "__main__":
            arr = np.arange(1 << 27, dtype=np.float64)                 # 1 GiB
            arr[::4097] *= -1.5
            want = hashlib.blake2b(arr).hexdigest()
            with dpool.ProcessPoolExecutor() as ex:
                ref = dpool.put(arr)
                del arr
                node, shape, got = ex.submit(digest, ref).result(timeout=180)
            assert shape == (1 << 27,) and got == want, (shape, got, want)
            print(node)
    """)
    head = cluster_far.head
    out = cluster_far.run_script(code, tmp_path, env=cluster_far.driver_env(
        DPOOL_STATE_DIR=head.state_dir), timeout=200)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and out.stdout.strip() != head.address


def test_copies_on_other_nodes_live_as_long_as_the_object(cluster_far, tmp_path):
    """A node keeps its copy of an input while the object lives (a later task there
    does not fetch it again, however long after), and frees it when the object's last
    reference dies on the driver."""
    code = textwrap.dedent("""
        import os, sys, time
        import numpy as np
        import dpool

        def where(a):
            return os.environ["DPOOL_NODE_ID"], float(a[::1000].sum())

        if __name__ == "__main__":
            arr = np.arange(8_000_000, dtype=np.float64)               # 64 MB
            with dpool.ProcessPoolExecutor() as ex:
                ref = dpool.put(arr)
                first = ex.submit(where, ref).result(timeout=60)
                print("COPIED", flush=True)
                sys.stdin.readline()                  # the test looks at the nodes' stores
                second = ex.submit(where, ref).result(timeout=60)
                assert first == second, (first, second)
                del ref
                print("FREED", flush=True)
                sys.stdin.readline()
    """)
    script = tmp_path / "driver_script.py"
    script.write_text(code)
    log = os.path.join(cluster_far.head.state_dir, "node.log")
    sent_before = _copies_sent(log)
    readers = {n.pid for n in cluster_far.nodes[1:]}

    def copies() -> set:
        return {name for name in os.listdir("/dev/shm") if name.startswith("dpool_")
                and int(name.split("_")[1]) in readers
                and os.path.getsize(os.path.join("/dev/shm", name)) >= 64_000_000}

    before = copies()
    driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                              env=cluster_far.driver_env(
                                  DPOOL_STATE_DIR=cluster_far.head.state_dir),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline() == "COPIED\n", driver.communicate(timeout=TIMEOUT)
        copy = copies() - before
        assert len(copy) == 1
        time.sleep(3)  # longer than the copies' former idle limit (2 s)
        assert copies() - before == copy
        driver.stdin.write("\n")
        driver.stdin.flush()
        assert driver.stdout.readline() == "FREED\n", driver.communicate(timeout=TIMEOUT)
        assert _copies_sent(log) - sent_before == 1
        deadline = time.monotonic() + 10
        while copies() - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not copies() - before  # freed on the node, with the driver still running
        driver.stdin.write("\n")
        driver.stdin.flush()
        _, err = driver.communicate(timeout=TIMEOUT)
        assert driver.returncode == 0, err
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
