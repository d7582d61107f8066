import time, statistics
import dpool
from dpool import ProcessPoolExecutor
from dpool.scheduling import _scheduler
from dpool.protocol import _channel
pc = time.perf_counter
marks = {}
orig_recv = _channel.Channel.recv_ready
def recv_ready(self):
    marks.setdefault("io_wake", pc())
    return orig_recv(self)
_channel.Channel.recv_ready = recv_ready
orig_deliver = _scheduler.LocalScheduler._deliver
def deliver(self, out):
    if out: marks.setdefault("deliver", pc())
    return orig_deliver(self, out)
_scheduler.LocalScheduler._deliver = deliver
orig_send = _channel.Channel.send
def send(self, body):
    r = orig_send(self, body); marks.setdefault("sent", pc()); return r
_channel.Channel.send = send
def noop():
    return time.perf_counter()
if __name__ == "__main__":
    rows = []
    with ProcessPoolExecutor(2) as ex:
        for _ in range(200): ex.submit(noop).result()
        for _ in range(2000):
            marks.clear()
            t0 = pc(); f = ex.submit(noop); t1 = pc(); tw = f.result(); t2 = pc()
            if "io_wake" in marks and "deliver" in marks:
                rows.append((marks["sent"] - t0, tw - marks["sent"], marks["io_wake"] - tw, marks["deliver"] - marks["io_wake"], t2 - marks["deliver"], t2 - t0))
    for i, name in enumerate(["submit->sent", "sent->worker runs", "worker ran->io wake", "io wake->deliver", "deliver->main back", "total"]):
        print(f"{name:22s} median {statistics.median(r[i] for r in rows)*1e6:7.1f} us")
