"""``python -m dpool run``: unmodified programs run on dpool, as ``python script.py`` would.

Each program runs both ways in a subprocess and the exit code, stdout and stderr are
compared (with the pools' class names the only expected difference).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT = 60


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT, env=env, check=False)


def _both(script: Path, *args: str) -> tuple[subprocess.CompletedProcess, ...]:
    cwd = script.parent.parent  # run from elsewhere: sys.path[0] must still be its dir
    rel = os.path.relpath(script, cwd)
    return _run([rel, *args], cwd), _run(["-m", "dpool", "run", rel, *args], cwd)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / "prog"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(textwrap.dedent(text))
    return p


PROGRAM = """
import concurrent.futures
import multiprocessing
import multiprocessing.pool
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import Pool

import helper  # next to the script: sys.path[0] is the script's directory


def cube(x):
    return x ** 3


def main():
    print("argv", sys.argv)
    print("name", __name__, "file", __file__.endswith("prog.py"))
    with ProcessPoolExecutor(2) as ex:
        print("ppe", type(ex).__module__, list(ex.map(cube, range(5))))
    with concurrent.futures.ProcessPoolExecutor(1) as ex:
        print("cf", type(ex).__module__, ex.submit(helper.double, 21).result())
    with Pool(2) as p:
        print("pool", type(p).__module__, p.map(cube, range(5)))
    with multiprocessing.pool.Pool(1) as p:
        print("mpp", type(p).__module__, p.apply(helper.double, (4,)))
    with multiprocessing.get_context("spawn").Pool(1) as p:
        print("ctx", type(p).__module__, p.apply(helper.double, (5,)))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[1]))


if __name__ == "__main__":
    main()
"""


def test_program_runs_unchanged_on_dpool(tmp_path):
    script = _write(tmp_path, "prog.py", PROGRAM)
    _write(tmp_path, "helper.py", "def double(x):\n    return 2 * x\n")
    std, ours = _both(script, "3", "--flag")
    assert std.returncode == ours.returncode == 3, (std.stderr, ours.stderr)
    assert std.stderr == ours.stderr == "to stderr\n"
    std_lines, our_lines = std.stdout.splitlines(), ours.stdout.splitlines()
    assert len(std_lines) == len(our_lines) == 7
    assert std_lines[0] == our_lines[0] == "argv ['prog/prog.py', '3', '--flag']"
    assert std_lines[1] == our_lines[1] == "name __main__ file True"
    expected_modules = {"ppe": "dpool.executor", "cf": "dpool.executor", "pool": "dpool.pool",
                        "mpp": "dpool.pool", "ctx": "dpool.pool"}
    for s, o in zip(std_lines[2:], our_lines[2:]):
        tag, s_mod, s_rest = s.split(" ", 2)
        o_tag, o_mod, o_rest = o.split(" ", 2)
        assert (tag, s_rest) == (o_tag, o_rest)
        assert not s_mod.startswith("dpool") and o_mod == expected_modules[tag]


@pytest.mark.parametrize("body, code", [
    ("def f():\n    raise KeyError('missing')\n\nf()\n", 1),
    ("x = (\n", 1),
    ("import sys\nsys.exit('bye')\n", 1),
    ("raise SystemExit(0)\n", 0),
    ("import sys\nprint('out'); sys.stdout.flush(); sys.exit(7)\n", 7),
])
def test_exit_status_and_tracebacks_match_python(tmp_path, body, code):
    script = _write(tmp_path, "fails.py", body)
    std, ours = _both(script)
    assert std.returncode == ours.returncode == code
    assert std.stdout == ours.stdout
    assert std.stderr == ours.stderr  # no dpool frames in the traceback


def test_missing_script(tmp_path):
    (tmp_path / "prog").mkdir()
    missing = tmp_path / "prog" / "nope.py"
    std, ours = _both(missing)
    assert std.returncode == ours.returncode == 2
    assert "can't open file" in ours.stderr and std.stderr == ours.stderr


def test_main_functions_and_lambdas_reach_the_workers(tmp_path):
    script = _write(tmp_path, "lam.py", """
        from multiprocessing import Pool
        if __name__ == "__main__":
            with Pool(2) as p:
                print(p.map(lambda x: x + 1, range(3)))
    """)
    ours = _run(["-m", "dpool", "run", str(script)], tmp_path)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == "[1, 2, 3]\n"  # the stdlib cannot pickle the lambda


def test_run_module(tmp_path):
    pkg = tmp_path / "pkgdir"
    pkg.mkdir()
    (pkg / "runme.py").write_text(textwrap.dedent("""
        import sys
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(1) as ex:
            print(type(ex).__module__, sys.argv[1:], __name__)
    """))
    ours = _run(["-m", "dpool", "run", "-m", "runme", "a"], pkg)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == "dpool.executor ['a'] __main__\n"


def test_usage():
    out = _run(["-m", "dpool"], Path.cwd())
    assert out.returncode == 2 and "usage" in out.stderr
    out = _run(["-m", "dpool", "run"], Path.cwd())
    assert out.returncode == 2 and "usage" in out.stderr
    out = _run(["-m", "dpool", "frobnicate"], Path.cwd())
    assert out.returncode == 2 and "unknown command" in out.stderr


def test_thread_pools_and_pool_subclasses_keep_the_stdlib(tmp_path):
    script = _write(tmp_path, "others.py", """
        import multiprocessing, multiprocessing.dummy, multiprocessing.pool
        from concurrent.futures import ThreadPoolExecutor

        class MyPool(multiprocessing.pool.Pool):  # may override internals: stays stdlib
            pass

        if __name__ == "__main__":
            with multiprocessing.pool.ThreadPool(2) as tp:
                print("threadpool", tp.map(abs, [-1, -2]))
            with multiprocessing.dummy.Pool(2) as dp:
                print("dummy", dp.map(abs, [-3]))
            with ThreadPoolExecutor(2) as ex:
                print("tpe", list(ex.map(abs, [-4])))
            with MyPool(1) as p:
                print("subclass", p.map(abs, [-5]), hasattr(p, "_taskqueue"))
            with multiprocessing.Pool(1) as p:
                print("isinstance", isinstance(p, multiprocessing.pool.Pool),
                      isinstance(multiprocessing.pool.ThreadPool(1), multiprocessing.pool.Pool))
    """)
    std, ours = _both(script)
    assert std.returncode == ours.returncode == 0, ours.stderr
    assert std.stdout == ours.stdout == (
        "threadpool [1, 2]\ndummy [3]\ntpe [4]\nsubclass [5] True\nisinstance True True\n")
    assert std.stderr == ours.stderr == ""


MANAGER_PROGRAM = """
import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def put(d, lock, k):
    with lock:
        d[k] = k * k
    return k


if __name__ == "__main__":
    with multiprocessing.Manager() as m, ProcessPoolExecutor(2) as ex:
        d, lock = m.dict(), m.Lock()
        print(sum(ex.map(put, [d] * 5, [lock] * 5, range(5))), sorted(d.items()))
        print("manager", type(m).__module__)
    with multiprocessing.get_context("spawn").Manager() as m:
        print("ctx", type(m).__module__, m.list([1, 2])[1])
"""


def test_multiprocessing_manager_is_bound_to_dpools(tmp_path):
    script = _write(tmp_path, "mgr.py", MANAGER_PROGRAM)
    std, ours = _both(script)
    assert std.returncode == ours.returncode == 0, (std.stderr, ours.stderr)
    std_lines, our_lines = std.stdout.splitlines(), ours.stdout.splitlines()
    assert std_lines[0] == our_lines[0] == "10 [(0, 0), (1, 1), (2, 4), (3, 9), (4, 16)]"
    assert std_lines[1] == "manager multiprocessing.managers"
    assert our_lines[1] == "manager dpool.managers._manager"
    assert std_lines[2] == "ctx multiprocessing.managers 2"
    assert our_lines[2] == "ctx dpool.managers._manager 2"


@pytest.mark.parametrize("address", ["", "127.0.0.1:1"])
def test_multiprocessing_manager_is_bound_on_a_cluster_too(address):
    # dpool's managers are actors, which run on a cluster too (nothing connects here:
    # binding only; tests/cluster/test_cluster_actors.py runs one)
    module = "dpool._run"
    code = ("from dpool._run import bind_stdlib; bind_stdlib(); "
            "import multiprocessing, multiprocessing.context as c; "
            "print(c.BaseContext.Manager.__module__, multiprocessing.Manager.__func__ is "
            "c.BaseContext.Manager)")
    env = {k: v for k, v in os.environ.items() if k != "DPOOL_ADDRESS"}
    if address:
        env["DPOOL_ADDRESS"] = address
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [module, "True"]
