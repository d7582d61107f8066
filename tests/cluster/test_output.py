"""What workers print reaches the driver line by line: whole, once, never split or blank,
whichever way it travels -- relayed by the node, straight over a lease, or one then the
other when a lease begins or ends in the middle of a line.

The driver scripts look at the lease itself (``ex._group.lease``), as
tests/cluster/test_leases.py does, to know which way a task's output went.
"""

from __future__ import annotations

import collections
import os
import signal
import textwrap

import pytest

from tests.cluster.conftest import TIMEOUT
from tests.cluster.test_leases import WAIT_FOR_LEASE, on_the_host


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def test_a_line_begun_before_a_lease_and_ended_over_it_is_whole(cluster, tmp_path):
    """A lent worker's initializer writes the start of a line; a task over the lease
    ends it. The node is stopped meanwhile (a busy machine, made certain), so anything
    relayed by it reaches the driver after what the lease carries: the start of the line
    must not travel by the node while its end goes over the lease (the CI failure of
    test_shutdown_waits_for_a_leased_task: a blank line, and 'init' printed last)."""
    code = textwrap.dedent("""
        import faulthandler, os, signal, sys, time
        import dpool
        faulthandler.dump_traceback_later(45, exit=True)

        NODE = int(sys.argv[1])

        def init():
            from dpool.runtime import _current
            if _current._worker.lease is None:
                return  # the group's worker the node runs: nothing to see there
            os.kill(NODE, signal.SIGSTOP)  # the driver lets it go on (and the test)
            sys.stdout.write("init ")
            sys.stdout.flush()
            time.sleep(0.3)  # what forwards the output has read it

        def pid():
            return os.getpid()

        def rest():
            print("rest")
            return os.getpid()

        if __name__ == "__main__":
            try:
                with dpool.ProcessPoolExecutor(1, initializer=init) as ex:
                    deadline = time.monotonic() + 30
                    while ex._group.lease is None:  # (no task through the node meanwhile)
                        assert time.monotonic() < deadline, "no lease within 30 s"
                        ex._driver.leases.request(ex._group)  # (what a submit does)
                        time.sleep(0.01)
                    lease = ex._group.lease
                    print("lent", ex.submit(rest).result(timeout=30) == lease.pid)
                    os.kill(NODE, signal.SIGCONT)
                    time.sleep(0.3)  # what the node had kept reaches us now
            finally:
                os.kill(NODE, signal.SIGCONT)
    """)
    try:
        out = cluster.run_script(code, tmp_path, str(cluster.head.pid),
                                 env=on_the_host(cluster))
    finally:
        _cont(cluster.head.pid)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["init rest", "lent True"], out.stdout


def test_a_line_ended_after_its_lease_is_whole(cluster, tmp_path):
    """A leased task starts a line, the lease ends (as when the node recalls it), the
    same worker, now the node's, ends the line; a last unfinished line is printed once,
    when the driver exits."""
    code = WAIT_FOR_LEASE + textwrap.dedent("""
        import os, sys
        import dpool

        def pid():
            return os.getpid()

        def start(i):
            print("start", i, end="", flush=True)
            print("err", i, end="", file=sys.stderr, flush=True)
            return os.getpid()

        def end(i):
            print("", "end", i)
            print("", "err end", i, file=sys.stderr)
            return os.getpid()

        def last():
            print("last, unfinished", end="")
            return os.getpid()

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(1) as ex:
                same = 0
                for i in range(3):
                    lease = wait_for_lease(ex, pid)
                    assert ex.submit(start, i).result() == lease.pid
                    ex._driver.leases.end(ex._group)  # what a recall from the node does
                    deadline = time.monotonic() + 30
                    while ex._group.lease is not None:
                        assert time.monotonic() < deadline, "the lease did not end"
                        time.sleep(0.01)
                    same += ex.submit(end, i).result() == lease.pid
                    ex._group.lease_retry_at = 0.0  # (ask for the next lease at once)
                print("same worker", same)
                ex.submit(last).result()
    """)
    out = cluster.run_script(code, tmp_path, env=on_the_host(cluster))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "last, unfinished", lines
    assert lines[:-1] == [*(f"start {i} end {i}" for i in range(3)), "same worker 3"], lines
    assert [x for x in out.stderr.splitlines() if x.startswith("err")] == \
        [f"err {i} err end {i}" for i in range(3)], out.stderr


@pytest.mark.timeout(2 * TIMEOUT)
def test_unbuffered_prints_arrive_whole_and_once(cluster, tmp_path):
    """Under PYTHONUNBUFFERED=1 a print is several writes (each argument, each separator,
    the newline). Initializers and tasks of leased and node-run workers print, executors
    come and go: every line arrives whole, once (initializers: once per worker)."""
    code = textwrap.dedent("""
        import os, sys
        import dpool

        def say(i, j):
            print("task", i, j, "a", "b", "c")
            print("task", i, j, "on", "stderr", file=sys.stderr)
            return os.getpid()

        if __name__ == "__main__":
            rounds = int(sys.argv[1])
            for i in range(rounds):
                with dpool.ProcessPoolExecutor(1, initializer=print,
                                               initargs=("init", i, "x", "y")) as ex:
                    for j in range(3):
                        ex.submit(say, i, j).result()
                    list(ex.map(say, [i] * 4, range(3, 7)))
    """)
    rounds = 12
    env = on_the_host(cluster)
    env["PYTHONUNBUFFERED"] = "1"
    out = cluster.run_script(code, tmp_path, str(rounds), env=env, timeout=2 * TIMEOUT - 10)
    assert out.returncode == 0, out.stderr
    lines = collections.Counter(out.stdout.splitlines())
    errs = collections.Counter(x for x in out.stderr.splitlines() if x.startswith("task"))
    for i in range(rounds):
        assert lines.pop(f"init {i} x y", 0) >= 1, (i, out.stdout)
        for j in range(7):
            assert lines.pop(f"task {i} {j} a b c", 0) == 1, (i, j, out.stdout)
            assert errs.pop(f"task {i} {j} on stderr", 0) == 1, (i, j, out.stderr)
    assert not lines, out.stdout  # nothing split, blank or doubled
    assert not errs, out.stderr
