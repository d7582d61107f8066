"""Programs that end while their executor or Pool still exists: they exit, as the stdlib's do.

Each scenario is a program run in a subprocess with the stdlib's classes and with dpool's,
under each start method; it must exit within the timeout and print the same lines.

What these guard against (issue 31): ``multiprocessing.util`` registers its exit hook
when it is first imported, which dpool (since its first task stopped importing it) leaves
to a spawn worker's start or to the program's own ``multiprocessing`` objects -- after
the runtime registered its own exit hook. That hook runs first and joins every child
``multiprocessing`` knows of, dpool's workers included, which end only when the runtime's
hook stops them: the program hung at exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

TIMEOUT = 60
METHODS = ("fork", "spawn", "forkserver")

# the program: an atexit hook registered before the executor submits to it
ATEXIT_SUBMIT = textwrap.dedent('''
    import atexit, sys

    @atexit.register
    def run_last():
        try:
            t.submit(id, None)
        except RuntimeError:
            print("runtime-error", flush=True)

    if sys.argv[1] == "stdlib":
        from concurrent.futures import ProcessPoolExecutor
    else:
        from dpool import ProcessPoolExecutor

    if __name__ == "__main__":
        from multiprocessing import get_context
        t = ProcessPoolExecutor(5, mp_context=get_context(sys.argv[2]))
        t.submit(print, "apple", flush=True)
''')

# multiprocessing.util first imported by the program, after its first task
QUEUE_AFTER_TASK = textwrap.dedent('''
    import sys
    if sys.argv[1] == "stdlib":
        from concurrent.futures import ProcessPoolExecutor
    else:
        from dpool import ProcessPoolExecutor

    if __name__ == "__main__":
        from multiprocessing import get_context
        ex = ProcessPoolExecutor(2, mp_context=get_context(sys.argv[2]))
        print(ex.submit(abs, -1).result(), flush=True)
        import multiprocessing
        q = multiprocessing.Queue()
        q.put("queue")
        print(q.get(), flush=True)
''')

# a Pool neither closed nor joined: terminated at exit
POOL_LEFT_OPEN = textwrap.dedent('''
    import sys
    if sys.argv[1] == "stdlib":
        from multiprocessing.pool import Pool
    else:
        from dpool import Pool

    if __name__ == "__main__":
        from multiprocessing import get_context
        p = Pool(2, context=get_context(sys.argv[2]))
        print(p.apply(abs, (-3,)), flush=True)
''')


def _run(tmp_path, program: str, impl: str, method: str) -> list[str]:
    script = tmp_path / "prog.py"
    script.write_text(program)
    try:
        done = subprocess.run([sys.executable, str(script), impl, method], cwd=tmp_path,
                              capture_output=True, text=True, timeout=TIMEOUT,
                              env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    except subprocess.TimeoutExpired as exc:  # (subprocess.run killed it)
        pytest.fail(f"{impl} program under {method} did not exit in {TIMEOUT} s; "
                    f"printed {exc.stdout!r}")
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("method", METHODS)
def test_atexit_hook_submitting_after_shutdown(tmp_path, impl, method):
    assert _run(tmp_path, ATEXIT_SUBMIT, impl, method) == ["apple", "runtime-error"]


@pytest.mark.parametrize("method", METHODS)
def test_program_importing_multiprocessing_after_a_task(tmp_path, impl, method):
    assert _run(tmp_path, QUEUE_AFTER_TASK, impl, method) == ["1", "queue"]


@pytest.mark.parametrize("method", METHODS)
def test_pool_left_open_at_exit(tmp_path, impl, method):
    assert _run(tmp_path, POOL_LEFT_OPEN, impl, method) == ["3"]
