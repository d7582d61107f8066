"""Task functions of the chaos tests, in a module of their own that imports nothing
heavy: a fresh worker loads it within its first task, and a kill then charges that task."""

import os
import time


def slow_square(x):
    time.sleep(0.001)
    return x * x


def pid_of(_x):
    time.sleep(0.001)
    return os.getpid()
