"""Compile dpool's sources once per test run, so that the hundreds of processes the suite
starts (node daemons, global schedulers, drivers, spawned workers) load bytecode instead of
compiling every module again.

Where ``PYTHONDONTWRITEBYTECODE`` is set (this machine and CI set it), Python never writes
``__pycache__``: each process then compiles each dpool module it imports from source (a
node daemon: ~0.3 s of CPU instead of ~0.12 s), and pytest rewrites every test module's
asserts again in each xdist worker (~6 s each). ``compile_once`` writes dpool's bytecode
(``compileall`` writes it whatever the variable says; the processes started later still
read it) and lets this test process cache its rewritten test modules. Only files under
the checkout are written, in ``__pycache__`` folders git ignores.
"""

from __future__ import annotations

import compileall
import sys

import pytest


def compile_once(config: pytest.Config) -> None:
    """Bring dpool's bytecode up to date (a no-op when it is) and allow the rewrite cache."""
    compileall.compile_dir(str(config.rootpath / "dpool"), quiet=1)
    sys.dont_write_bytecode = False
