"""The fork server (``scheduling._zygote``): workers forked by a single-threaded copy of
the driver, never by the driver's threads (issue 31, item 9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures.process import BrokenProcessPool

import psutil
import pytest

from dpool import ProcessPoolExecutor
from dpool.scheduling import _forkproc, _zygote

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not (_forkproc.AVAILABLE and _zygote.usable()),
                                 reason="no pidfds here: workers are forked by the driver")]


def _run(program: str, timeout: float = 45, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(program)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


PARENTS = """
    import multiprocessing, os, sys, threading, time
    import psutil
    from dpool import ProcessPoolExecutor

    def parents(_):
        time.sleep(0.2)  # (both workers busy: one task each)
        return os.getppid(), multiprocessing.parent_process().pid

    if __name__ == "__main__":
        if sys.argv[1] == "threaded":
            threading.Thread(target=threading.Event().wait, daemon=True).start()
        with ProcessPoolExecutor(2) as ex:
            found = list(ex.map(parents, range(2)))
            ex._processes  # (all running, as the stdlib's)
            (zygote,) = [p for p in psutil.Process().children() if p.name() == "dpool-zygote"]
        me = os.getpid()
        print(sorted("driver" if pp == me else "zygote" if pp == zygote.pid else pp
                     for pp, _ in found), all(mp == me for _, mp in found))
"""


@pytest.mark.parametrize("driver", ["threaded", "single-threaded"])
def test_workers_come_from_the_fork_server_and_know_the_driver_as_their_parent(driver):
    """A driver that runs threads has every worker forked by the server; one that runs
    none forks its first worker itself, with the server, at the same moment.
    ``multiprocessing.parent_process()`` is the driver either way."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(PARENTS), driver],
                         capture_output=True, text=True, timeout=45)
    assert out.returncode == 0, out.stderr
    first = "'zygote'" if driver == "threaded" else "'driver'"
    assert out.stdout.strip() == f"[{first}, 'zygote'] True"


LOCKED_PROGRAM = """
    import os, threading, time
    from concurrent import futures
    from dpool import ProcessPoolExecutor

    LOCK = threading.Lock()

    def take_the_lock(_):
        with LOCK:  # a copy of a lock another thread of the driver holds: never free
            return "took it"

    if __name__ == "__main__":
        with ProcessPoolExecutor(1) as ex:
            ex.submit(int).result()  # the runtime runs
        holder = threading.Thread(target=lambda: (LOCK.acquire(), time.sleep(60)),
                                  daemon=True)
        holder.start()
        while not LOCK.locked():
            time.sleep(0.001)
        ex = ProcessPoolExecutor(1)  # a new worker, forked while LOCK is held
        try:
            print(ex.submit(take_the_lock, 0).result(timeout=TIMEOUT))
        except futures.TimeoutError:  # (not the builtin's before 3.11)
            print("deadlocked", flush=True)
            os._exit(3)  # (its worker, stuck for good, sees the driver gone and ends)
        ex.shutdown()
"""


def test_a_worker_never_inherits_a_lock_another_thread_holds():
    """Forked by the driver, the worker would copy LOCK held, and wait forever."""
    out = _run(LOCKED_PROGRAM.replace("TIMEOUT", "20"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "took it"


def test_with_the_fork_server_turned_off_the_driver_forks_its_workers():
    """``DPOOL_FORK_SERVER=0``: forked by the driver, as before; the lock test above
    then shows the deadlock it prevents (the task times out)."""
    out = _run(LOCKED_PROGRAM.replace("TIMEOUT", "3"), DPOOL_FORK_SERVER="0")
    assert (out.returncode, out.stdout.strip()) == (3, "deadlocked"), out.stderr


WARNINGS = """
    import sys, threading, warnings
    from dpool import ProcessPoolExecutor, Pool

    if __name__ == "__main__":
        def thread():
            threading.Thread(target=threading.Event().wait, daemon=True).start()

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if sys.argv[1] == "before":
                thread()  # the program runs a thread of its own before its first task
            with ProcessPoolExecutor(2) as ex:
                print(sum(ex.map(abs, range(-50, 0))))
                thread()  # ... or after it
            with Pool(2, maxtasksperchild=1) as pool:  # replaced after every task
                print(sum(pool.map(abs, range(10), chunksize=1)))
        print(sum("fork()" in str(w.message) for w in seen))
"""


@pytest.mark.parametrize("thread", ["after", "before"])
def test_workers_are_never_forked_by_a_process_with_threads(thread):
    """Python 3.12+ warns each time a process with threads forks: after the program's
    first task, the driver runs dpool's threads (and here one of the program's), and no
    worker is forked by it (the stdlib's classes warn 12 times in this program, on 3.13).
    A program that runs threads of its own before its first task gets one such fork, the
    server's own (as the stdlib's executor forks at its first submit): one warning, where
    the Python warns at all."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(WARNINGS), thread],
                         capture_output=True, text=True, timeout=45)
    assert out.returncode == 0, out.stderr
    warns = sys.version_info >= (3, 12)
    expected = "1" if thread == "before" and warns else "0"
    assert out.stdout.split() == ["1275", "45", expected], out.stderr


def test_a_worker_gets_the_drivers_environment_directory_and_output_of_now():
    """What the program changed after its runtime started, a new worker sees: the
    environment, the working directory, where stdout goes (a redirect at the descriptor)."""
    out = _run("""
        import os, sys, tempfile
        from dpool import ProcessPoolExecutor

        def report(_):
            print("from the worker", flush=True)
            return os.environ.get("LATE"), os.getcwd()

        if __name__ == "__main__":
            with ProcessPoolExecutor(1) as ex:
                ex.submit(int).result()
            os.environ["LATE"] = "set after the start"
            where = os.path.realpath(tempfile.mkdtemp())
            os.chdir(where)
            with open("out.txt", "w") as f:
                saved = os.dup(1)
                os.dup2(f.fileno(), 1)
                with ProcessPoolExecutor(1) as ex:
                    late, cwd = ex.submit(report, 0).result()
                os.dup2(saved, 1)
            print(late, cwd == where, open("out.txt").read().strip())
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "set after the start True from the worker"


def _exit(code: int) -> None:
    os._exit(code)


def test_exit_codes_and_signals_reach_the_driver():
    with ProcessPoolExecutor(1) as ex:
        with pytest.raises(BrokenProcessPool, match="exit code 7"):
            ex.submit(_exit, 7).result()
    with ProcessPoolExecutor(1) as ex:
        pid = ex.submit(os.getpid).result()
        (proc,) = ex._processes.values()
        os.kill(pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL and not proc.is_alive()


def _big(blob: bytes) -> None:
    global BLOB
    BLOB = blob


def _blob_size(_: object) -> int:
    return len(BLOB)


def test_a_large_initializer_travels_to_the_fork_server_in_pieces():
    blob = os.urandom(300_000)  # past one message (``_zygote._CHUNK``)
    with ProcessPoolExecutor(2, initializer=_big, initargs=(blob,)) as ex:
        assert list(ex.map(_blob_size, range(4))) == [300_000] * 4


def test_workers_still_start_when_the_fork_server_is_killed():
    out = _run("""
        import os, signal
        import psutil
        from dpool import ProcessPoolExecutor

        if __name__ == "__main__":
            with ProcessPoolExecutor(1) as ex:
                ex.submit(int).result()
                (zygote,) = [p.pid for p in psutil.Process().children()
                             if p.name() == "dpool-zygote"]
            os.kill(zygote, signal.SIGKILL)
            with ProcessPoolExecutor(2) as ex:
                print(sorted(ex.map(abs, [-1, -2, -3])), ex.submit(os.getppid).result()
                      == os.getpid())
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1, 2, 3] True"
    assert "the fork server is gone" in out.stderr


def test_a_killed_driver_leaves_no_fork_server_and_no_worker():
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time
        from dpool import ProcessPoolExecutor
        if __name__ == "__main__":
            ex = ProcessPoolExecutor(2)
            pids = set(ex.map(lambda _: (os.getpid(), os.getppid()), range(20)))
            print(" ".join(str(p) for pair in pids for p in pair), flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        pids = {int(p) for p in proc.stdout.readline().split()}
        assert pids, "the program printed no pid"
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while deadline > time.monotonic():
            alive = [p for p in pids if psutil.pid_exists(p)
                     and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            if not alive:
                break
            time.sleep(0.05)
        assert not alive
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
