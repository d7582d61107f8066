"""``TaskFuture`` behaves as ``concurrent.futures.Future`` does, and ``dpool._log``'s
loggers as ``logging``'s.

``TaskFuture`` is written without importing ``concurrent.futures`` (what ``Pool`` runs
on); ``dpool.Future`` is it plus the stdlib's class as a base. Each scenario is run on a
stdlib future and on both of ours, and must end the same way: return values, states,
exception types, callbacks, reprs, and the stdlib's ``wait``/``as_completed`` working on
them.
"""

from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from dpool._task_future import TaskFuture
from dpool.futures import Future

KINDS = [cf.Future, TaskFuture, Future]


def _outcome(fn):
    try:
        return ("ok", fn())
    except BaseException as exc:  # noqa: BLE001 - the type is the outcome
        return ("raised", type(exc))


def _scenario(make, steps):
    f = make()
    seen = []
    f.add_done_callback(lambda fut: seen.append(("callback", fut.done())))
    out = [_outcome(lambda s=s: s(f)) for s in steps]
    state = (f.done(), f.cancelled(), f.running(), f._state)
    return out, state, seen


SCENARIOS = {
    "result": [lambda f: f.set_running_or_notify_cancel(), lambda f: f.set_result(3),
               lambda f: f.result(), lambda f: f.exception(), lambda f: f.set_result(4)],
    "exception": [lambda f: f.set_running_or_notify_cancel(),
                  lambda f: f.set_exception(ValueError("x")), lambda f: f.result(0),
                  lambda f: type(f.exception()), lambda f: f.set_exception(KeyError())],
    "cancel pending": [lambda f: f.cancel(), lambda f: f.cancel(), lambda f: f.result(0),
                       lambda f: f.exception(0), lambda f: f.set_running_or_notify_cancel(),
                       lambda f: f.set_result(1)],
    "cancel running": [lambda f: f.set_running_or_notify_cancel(), lambda f: f.cancel(),
                       lambda f: f.result(0.01), lambda f: f.exception(0.01)],
    "twice running": [lambda f: f.set_running_or_notify_cancel(),
                      lambda f: f.set_running_or_notify_cancel()],
    "timeouts": [lambda f: f.result(0), lambda f: f.exception(0.01)],
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_ends_as_with_the_stdlib_future(name):
    expected = _scenario(cf.Future, SCENARIOS[name])
    for kind in (TaskFuture, Future):
        assert _scenario(kind, SCENARIOS[name]) == expected, kind


def test_the_exceptions_are_the_stdlibs():
    f = TaskFuture()
    with pytest.raises(cf.TimeoutError):
        f.result(0)
    f.cancel()
    with pytest.raises(cf.CancelledError):
        f.result()
    g = TaskFuture()
    g.set_result(1)
    with pytest.raises(cf.InvalidStateError, match="FINISHED"):
        g.set_result(2)


def test_the_attributes_are_those_the_stdlib_functions_read():
    assert set(vars(cf.Future())) <= set(vars(TaskFuture()))
    assert isinstance(Future(), cf.Future) and not isinstance(TaskFuture(), cf.Future)
    # every method of a dpool.Future is TaskFuture's, not the stdlib's
    for name, value in vars(cf.Future).items():
        if callable(value) and not name.startswith(("__", "_Future__")):
            assert getattr(Future, name) is getattr(TaskFuture, name), name


@pytest.mark.parametrize("kind", KINDS)
def test_repr_as_the_stdlibs(kind):
    def shown(f):
        return repr(f).replace(type(f).__name__, "X").replace(hex(id(f)), "ID")

    for step in (lambda f: None, lambda f: f.set_running_or_notify_cancel(),
                 lambda f: f.set_result([]), lambda f: f.set_exception(OSError()),
                 lambda f: f.cancel()):
        mine, theirs = kind(), cf.Future()
        step(mine)
        step(theirs)
        assert shown(mine) == shown(theirs)


@pytest.mark.parametrize("kind", [TaskFuture, Future])
def test_the_stdlib_wait_and_as_completed_take_them(kind):
    fs = [kind() for _ in range(3)]

    def finish():
        time.sleep(0.05)
        fs[1].set_result("b")
        fs[0].set_exception(ValueError())

    t = threading.Thread(target=finish)
    t.start()
    done, pending = cf.wait(fs, timeout=10, return_when=cf.FIRST_COMPLETED)
    assert done and fs[2] in pending
    order = list(cf.as_completed(fs[:2], timeout=10))
    assert set(order) == {fs[0], fs[1]}
    t.join()
    with pytest.raises(cf.TimeoutError):
        list(cf.as_completed(fs, timeout=0.05))
    fs[2].cancel()  # (a cancelled future counts once the runtime notified it: as the
    fs[2].set_running_or_notify_cancel()  # stdlib's executors do)
    done, pending = cf.wait(fs, timeout=10)
    assert done == set(fs) and not pending


def test_a_failing_callback_is_logged_as_the_stdlib_logs_it(caplog):
    f = TaskFuture()
    f.add_done_callback(lambda fut: 1 / 0)
    with caplog.at_level("ERROR", logger="concurrent.futures"):
        f.set_result(1)
    assert f.result() == 1
    [rec] = [r for r in caplog.records if r.name == "concurrent.futures"]
    assert rec.getMessage().startswith("exception calling callback for <TaskFuture")
    assert rec.exc_info[0] is ZeroDivisionError


def test_a_generic_alias_as_the_stdlibs():
    assert Future[int].__origin__ is Future and TaskFuture[str].__args__ == (str,)


# -- dpool._log ---------------------------------------------------------------------------
def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60)


def test_debug_without_logging_loaded_is_dropped_and_loads_nothing():
    out = _run("""
        import sys
        from dpool import _log
        log = _log.getLogger("dpool.x")
        log.debug("not shown %s", 1)
        log.info("nor this")
        assert not log.isEnabledFor(10)
        print("logging" in sys.modules)
        log.warning("shown %s", 2)
        print("logging" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
    assert out.stderr == "shown 2\n"  # logging's last-resort handler, as unconfigured


def test_records_name_the_caller_and_follow_a_later_configuration():
    out = _run("""
        from dpool import _log
        log = _log.getLogger("dpool.y")

        def where():
            log.debug("early")  # dropped: nobody configured logging yet
            import logging
            logging.basicConfig(level=logging.DEBUG,
                                format="%(name)s %(funcName)s %(lineno)d %(message)s")
            log.debug("d %s", 1)
            try:
                1 / 0
            except ZeroDivisionError:
                log.exception("e")

        where()
    """)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == "dpool.y where 10 d 1"
    assert lines[1] == "dpool.y where 14 e" and "ZeroDivisionError" in out.stderr
    assert "early" not in out.stderr
