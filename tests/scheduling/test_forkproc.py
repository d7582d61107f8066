"""Workers forked by ``scheduling._forkproc``: multiprocessing processes in every way a
program can see, started without ``multiprocessing.util``/``popen_fork``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import pytest

from dpool import ProcessPoolExecutor
from dpool.scheduling import _forkproc

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not _forkproc.AVAILABLE, reason="no light fork here")]


def _who_am_i() -> tuple:
    me = multiprocessing.current_process()
    parent = multiprocessing.parent_process()
    return (me.name, me.pid, os.getpid(), parent.pid, parent.is_alive(),
            multiprocessing.get_start_method(), sys.stdin.read())


def test_a_worker_is_a_multiprocessing_child_of_the_driver():
    with ProcessPoolExecutor(1) as ex:
        name, mp_pid, pid, parent, parent_alive, method, stdin = ex.submit(_who_am_i).result()
        (view,) = ex._processes.values()
        assert type(view._process) is _forkproc.ForkedWorker  # the light path was taken
    assert name.startswith("dpool-worker-") and name == view.name
    assert mp_pid == pid == view.pid
    assert parent == os.getpid() and parent_alive
    assert method == "fork"
    assert stdin == ""  # /dev/null, as multiprocessing gives its children


def _put_from_worker(q: multiprocessing.Queue) -> None:
    q.put(("from the initializer", os.getpid()))


def test_a_queue_the_driver_already_used_works_in_the_worker():
    """The program's multiprocessing objects get their after-fork hooks: a queue whose
    feeder thread runs in the driver starts its own in the worker (without the hooks the
    worker's puts would sit in a buffer nobody sends)."""
    q: multiprocessing.Queue = multiprocessing.Queue()
    q.put("from the driver")  # starts the driver's feeder thread
    assert q.get(timeout=10) == "from the driver"
    with ProcessPoolExecutor(1, initializer=_put_from_worker, initargs=(q,)) as ex:
        worker_pid = ex.submit(os.getpid).result()
        assert q.get(timeout=10) == ("from the initializer", worker_pid)
    q.close()
    q.join_thread()


def _exit_with(code: object) -> None:
    sys.exit(code)


def _raise() -> None:
    raise ValueError("boom in the child")


@pytest.mark.parametrize("target, args, code", [
    (_exit_with, (5,), 5), (_exit_with, (None,), 0), (_exit_with, ("a message",), 1),
    (_raise, (), 1), (os.getpid, (), 0),
])
def test_exit_codes_are_multiprocessing_s(target, args, code, capfd):
    p = _forkproc.ForkedWorker(target=target, args=args, name="probe")
    p.start()
    p.join(30)
    assert p.exitcode == code
    err = capfd.readouterr().err
    if target is _raise:
        assert "Process probe:" in err and "ValueError: boom in the child" in err
    if args == ("a message",):
        assert "a message" in err
    p.close()


def test_join_with_a_timeout_then_kill():
    p = _forkproc.ForkedWorker(target=time.sleep, args=(60,), name="sleeper")
    p.start()
    p.join(0.1)  # (a join that did not time out would hang until the test's timeout)
    assert p.exitcode is None and p.is_alive()
    p.kill()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL and not p.is_alive()
    p.close()
