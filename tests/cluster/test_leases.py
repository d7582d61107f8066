"""Worker leases: a driver on its node's host sends tasks straight to a lent worker.

The driver scripts look at the lease itself (``ex._group.lease``) to prove the task went
over it: the worker that ran it is the lent one. Everything else is what a user sees.
"""

from __future__ import annotations

import textwrap

from tests.cluster.conftest import TIMEOUT


def on_the_host(cluster) -> dict:
    """A driver on the head's host: it attaches over the node's unix socket."""
    return cluster.driver_env(DPOOL_STATE_DIR=cluster.head.state_dir)


WAIT_FOR_LEASE = """
import faulthandler, time
faulthandler.dump_traceback_later(45, exit=True)  # a hang shows its stacks in the test

def wait_for_lease(ex, fn):
    deadline = time.monotonic() + 30
    while ex._group.lease is None:
        assert time.monotonic() < deadline, "no lease within 30 s"
        ex.submit(fn).result()
        time.sleep(0.05)
    return ex._group.lease
"""


def test_tasks_go_over_the_lease_and_behave_as_usual(cluster, tmp_path):
    code = WAIT_FOR_LEASE + textwrap.dedent("""
        import os, threading
        import numpy as np
        import dpool

        def pid():
            return os.getpid()

        def boom(x):
            raise ValueError(f"bad {x}")

        def slow():
            time.sleep(0.3)
            return "slow"

        def nested(n):
            ex = dpool.get_executor()
            return sum(f.result() for f in [ex.submit(abs, -i) for i in range(n)]), os.getpid()

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                lease = wait_for_lease(ex, pid)
                print([ex.submit(pid).result() == lease.pid for _ in range(20)].count(True))
                try:
                    ex.submit(boom, 3).result()
                except ValueError as exc:
                    print("ValueError", exc, "boom" in str(exc.__cause__))
                a = ex.submit(lambda: 20)                      # over the lease
                print(a.result(), ex.submit(lambda x: x + 1, a).result())  # then a dependency
                big = ex.submit(np.ones, (1000, 1000)).result()   # 8 MB, from the store
                print(big.shape, float(big.sum()))
                f = ex.submit(slow)
                time.sleep(0.05)
                print(f.running(), f.cancel(), f.result(timeout=30))
                print(ex.submit(pid).result(timeout=0.0001 + 30) == lease.pid)
                total, where = ex.submit(nested, 10).result(timeout=30)
                print(total, where == lease.pid)
                print(ex.submit(print, "out", "put").result())  # output reaches us
                del big
    """)
    out = cluster.run_script(code, tmp_path, env=on_the_host(cluster))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "20", "ValueError bad 3 True", "20 21", "(1000, 1000) 1000000.0",
        "True False slow", "True", "45 True", "out put", "None"]


def test_a_leased_tasks_future_as_an_argument(cluster, tmp_path):
    """Dataflow across the two paths: a task through the node waits for a leased task's
    result (also as an ObjectRef inside a list, fetched by the worker)."""
    code = WAIT_FOR_LEASE + textwrap.dedent("""
        import os
        import dpool

        def pid():
            return os.getpid()

        def slow(x):
            time.sleep(0.5)
            return x

        def add(a, b):
            return a + b

        def total(refs):
            return sum(dpool.get(refs))

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                lease = wait_for_lease(ex, pid)
                f1 = ex.submit(slow, 20)                 # over the lease, still running
                f2 = ex.submit(add, f1, 22)              # through the node: waits for f1
                print(f2.result(timeout=30))
                f3 = ex.submit(slow, 5)
                print(ex.submit(total, [dpool.put(1), f3]).result(timeout=30))
                g = ex.submit(slow, 7)
                del g                                    # dropped while it runs
                print(ex.submit(add, 1, 2).result(timeout=30))
    """)
    out = cluster.run_script(code, tmp_path, env=on_the_host(cluster))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["42", "6", "3"]


def test_one_worker_executor_gets_its_worker_back_from_the_lease(cluster, tmp_path):
    """max_workers=1: the lent worker is the group's only one; tasks queued at the node
    make the node recall it, and they run."""
    code = textwrap.dedent("""
        import time
        import dpool

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(1) as ex:
                time.sleep(0.5)                          # the lease is granted meanwhile
                print(sum(ex.map(abs, range(-100, 0))))  # a burst through the node
                print([ex.submit(abs, -i).result() for i in range(5)])
                fs = [ex.submit(abs, -i) for i in range(50)]
                print(sum(f.result(timeout=30) for f in fs))
    """)
    out = cluster.run_script(code, tmp_path, env=on_the_host(cluster))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(sum(range(1, 101))), "[0, 1, 2, 3, 4]",
                                       str(sum(range(50)))]


def test_a_leased_worker_that_dies_is_retried_and_typed(cluster, tmp_path):
    code = WAIT_FOR_LEASE + textwrap.dedent("""
        import os, sys
        import dpool

        def pid():
            return os.getpid()

        def die_once(marker):
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(3)
            return "survived"

        def die():
            os._exit(4)

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                lease = wait_for_lease(ex, pid)
                print(ex.submit(die_once, sys.argv[1]).result(timeout=60))
                try:
                    ex.submit(die).result(timeout=60)
                except dpool.WorkerCrashedError as exc:
                    print("crashed", type(exc).__mro__[1].__name__ != "", exc.attempts >= 1)
                print(ex.submit(abs, -7).result(timeout=60))   # still usable
    """)
    out = cluster.run_script(code, tmp_path, str(tmp_path / "marker"), env=on_the_host(cluster))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["survived", "crashed True True", "7"]


def test_terminating_a_pool_with_a_leased_task_fails_it_and_leaves_nothing(cluster, tmp_path):
    code = WAIT_FOR_LEASE + textwrap.dedent("""
        import os
        import dpool
        from concurrent.futures.process import BrokenProcessPool

        def pid():
            return os.getpid()

        if __name__ == "__main__":
            ex = dpool.ProcessPoolExecutor(2)
            lease = wait_for_lease(ex, pid)
            f = ex.submit(time.sleep, 60)
            time.sleep(0.2)
            ex._terminate("terminated by the test")
            try:
                f.result(timeout=30)
            except BrokenProcessPool as exc:
                print("broken")
            ex.shutdown()
            print("done")
    """)
    out = cluster.run_script(code, tmp_path, timeout=TIMEOUT, env=on_the_host(cluster))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["broken", "done"]


def test_shutdown_waits_for_a_leased_task(cluster, tmp_path):
    code = WAIT_FOR_LEASE + textwrap.dedent("""
        import os
        import dpool

        def pid():
            return os.getpid()

        def slow_pid(t):
            time.sleep(t)
            return os.getpid()

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                lease = wait_for_lease(ex, pid)
                f = ex.submit(slow_pid, 1.0)
                t0 = time.monotonic()
            print(f.done(), f.result() == lease.pid, time.monotonic() - t0 > 0.8)
            with dpool.ProcessPoolExecutor(1, initializer=print, initargs=("init",)) as ex:
                print(sum(ex.map(abs, range(-20, 0))), ex.submit(pid).result() > 0)
    """)
    out = cluster.run_script(code, tmp_path, env=on_the_host(cluster))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "True True True"
    # (a worker's initializer prints when it starts, in no set order with the driver's)
    assert sorted(set(lines[1:])) == [f"{sum(range(1, 21))} True", "init"], lines


def test_a_request_for_every_cpu_gets_the_lent_one_back(cluster, tmp_path):
    """A task asking for both CPUs of the node while one is lent (idle) to the driver:
    the node recalls the lease, and the task runs."""
    code = WAIT_FOR_LEASE + textwrap.dedent("""
        import os
        import dpool

        def pid():
            return os.getpid()

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                lease = wait_for_lease(ex, pid)
                print(ex.options(num_cpus=2).submit(abs, -3).result(timeout=30))
                print(ex.submit(abs, -4).result(timeout=30))
    """)
    out = cluster.run_script(code, tmp_path, env=on_the_host(cluster))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["3", "4"]
