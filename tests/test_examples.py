"""The examples run as a user would run them, and say what they promise."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name, expected", [
    ("quickstart.py", "1099726899285419 is prime: False"),
    ("nested_tasks.py", "fib(7) = 13"),
    ("shared_arrays.py", "the driver's array is untouched: 8388608.0"),
    ("gpu.py", "every task had one: True; results agree: True"),
    ("actors.py", "20 rollouts scored"),
    ("parameter_server.py", "learned: True"),
    ("collective_sgd.py", "learned: True after losing a replica: True"),
])
def test_example_runs(name, expected):
    out = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert expected in out.stdout
