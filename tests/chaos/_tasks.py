"""Task functions of the chaos tests, in a module of their own that imports nothing
heavy. A task leaves a file named by its worker's pid in ``$CHAOS_WARM_DIR`` the first
time that worker runs one: the chaos kills only such warm workers (``test_worker_kills``)."""

import os
import time

_warm = False


def slow_square(x):
    global _warm
    if not _warm:
        where = os.environ.get("CHAOS_WARM_DIR")
        if where:
            open(os.path.join(where, str(os.getpid())), "w").close()
        _warm = True
    time.sleep(0.001)
    return x * x
