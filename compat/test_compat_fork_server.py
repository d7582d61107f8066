"""Programs that change their globals between pools: their workers see what the stdlib's do.

dpool's workers are forked by a fork server, a copy of the program as it was when the
first executor was first used (``scheduling/_zygote``; DIFFERENCES.md). The stdlib's
``fork`` workers are copies of the program as it is when each pool starts them. A function
of the main script that reads a global the program rebound since the fork server was
forked goes to the workers by value, with that global's value: the results are the
stdlib's. Each program runs in a subprocess with the stdlib's classes and with dpool's
and must print the same lines.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

PHASES = textwrap.dedent('''
    import sys
    if sys.argv[1] == "stdlib":
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import Pool
    else:
        from dpool import ProcessPoolExecutor, Pool

    def scaled(x):
        return x * SCALE + helper()

    def helper():  # reads a global the program sets later: called by scaled
        return OFFSET

    def uses_new(x):
        return x + NEW

    def init():
        global SCALE
        SCALE = 100

    if __name__ == "__main__":
        SCALE, OFFSET = 1, 0
        with ProcessPoolExecutor(2) as ex:
            print(list(ex.map(scaled, range(3))))
        SCALE = 2  # rebound: the next pools' workers see 2
        with ProcessPoolExecutor(2) as ex:
            print(list(ex.map(scaled, range(3))))
        OFFSET = 5  # read through another function of the script
        with Pool(2) as p:
            print(p.map(scaled, range(3)))
        with Pool(2, initializer=init) as p:  # what a worker assigns itself stays
            print(p.map(scaled, range(3)))
        def scaled(x):  # the name rebound to another function
            return -x
        with ProcessPoolExecutor(2) as ex:
            print(list(ex.map(scaled, range(3))))
        NEW = 7  # a global that did not exist when the first pool started
        with ProcessPoolExecutor(2) as ex:
            print(list(ex.map(uses_new, range(2))))
''')


def _run(tmp_path, side: str) -> list[str]:
    script = tmp_path / "phases.py"
    script.write_text(PHASES)
    out = subprocess.run([sys.executable, str(script), side], capture_output=True,
                         text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_globals_rebound_between_pools_reach_the_later_pools_workers(tmp_path):
    stdlib = _run(tmp_path, "stdlib")
    assert stdlib[:2] == ["[0, 1, 2]", "[0, 2, 4]"]  # (the stdlib's, as this test assumes)
    assert _run(tmp_path, "dpool") == stdlib
