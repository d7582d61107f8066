"""Where a no-op round trip's time goes, step by step (median of 2,000).

submit() -> waiter starts leading -> worker runs the function -> the waiting thread
(or the IO thread) reads the result -> frames handled -> future completed -> result()
returns. Timestamps: time.perf_counter in both processes (CLOCK_MONOTONIC, shared).
"""

import statistics
import threading
import time

from dpool import ProcessPoolExecutor
from dpool.protocol import _channel
from dpool.scheduling import _scheduler

pc = time.perf_counter
marks: dict = {}
_main = threading.main_thread()


def _wrap(cls, name, before=None, after=None):
    orig = getattr(cls, name)

    def wrapper(self, *a):
        if before:
            marks.setdefault(before, pc())
        r = orig(self, *a)
        if after and (name != "deliver" or a[0]):
            marks.setdefault(after, pc())
        return r

    setattr(cls, name, wrapper)


_wrap(_channel.Channel, "send", after="sent")
_wrap(_channel.Channel, "recv_ready", before="read")
_wrap(_scheduler.LocalScheduler, "_handle_frames", after="handled")
_wrap(_scheduler.LocalScheduler, "deliver", after="delivered")
_orig_lead = _scheduler.LocalScheduler.lead


def _lead(self, f, t):
    marks["lead"] = pc()
    return _orig_lead(self, f, t)


_scheduler.LocalScheduler.lead = _lead
_orig_recv = _channel.Channel.recv_ready


def _recv(self):
    marks.setdefault("reader", threading.current_thread() is _main)
    return _orig_recv(self)


_channel.Channel.recv_ready = _recv


def noop():
    return time.perf_counter()


STEPS = ["submit -> sent", "sent -> submit returns", "submit returns -> leading",
         "submit returns -> worker runs fn", "fn ran -> recv starts", "recv + handle frames",
         "", "deliver (complete future)", "-> result() returns", "total"]

if __name__ == "__main__":
    rows = []
    by_waiter = 0
    with ProcessPoolExecutor(2) as ex:
        for _ in range(300):
            ex.submit(noop).result()
        for _ in range(2000):
            marks.clear()
            t0 = pc()
            f = ex.submit(noop)
            t1 = pc()
            tw = f.result()
            t2 = pc()
            m = marks
            if not all(k in m for k in ("sent", "lead", "read", "handled", "delivered")):
                continue
            by_waiter += bool(m.get("reader"))
            rows.append((m["sent"] - t0, t1 - m["sent"], m["lead"] - t1, tw - t1, m["read"] - tw,
                         m["handled"] - m["read"], 0.0, m["delivered"] - m["handled"],
                         t2 - m["delivered"], t2 - t0))
    for i, name in enumerate(STEPS):
        if not name:
            continue
        print(f"{name:32s} median {statistics.median(r[i] for r in rows) * 1e6:7.1f} us")
    print(f"results read by the waiting thread itself: {by_waiter} of {len(rows)}")
