"""Lineage rebuilds (issue 17, item 3): values whose only copy died with a node come
back by running again the tasks that made them, through their inputs; a function marked
``dpool.no_rebuild`` is not run again and its future fails with
``ObjectLostError``.

Two loopback clusters: a head with no CPUs whose driver (on the head's host) sends
every task to the two other nodes, one of which is SIGKILLed mid-way through chains of
dependent tasks passing 8 MB arrays; and two nodes whose TCP driver loses its own node
while a chain runs (the driver moves, ``_move``, and runs the lost links again). And on
one host, under memory pressure: readers of spilled results, and of results rebuilt
because their spill files were cut short, wait for room instead of failing.
"""

from __future__ import annotations

import gc
import glob
import os
import tempfile
import textwrap
import time

import numpy as np
import pytest

from dpool import ProcessPoolExecutor
from tests.cluster.conftest import start_cluster, stop_cluster

CHAINS = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import dpool

    def step(a, k, ran):
        time.sleep(0.25)
        with open(os.path.join(ran, os.environ["DPOOL_NODE_ID"]), "a") as f:
            f.write(f"{k}\\n")
        return a + k                                   # 8 MB in, 8 MB out

    if __name__ == "__main__":
        with dpool.ProcessPoolExecutor() as ex:
            chains = []
            for c in range(4):
                fs = [ex.submit(step, np.full(1_000_000, float(c)), 1, sys.argv[2])]
                for k in range(2, 7):
                    fs.append(ex.submit(step, fs[-1], k, sys.argv[2]))
                chains.append(fs)
            # kill a worker node once it ran a link (mid-chain: six links per chain)
            pids = dict(x.split("=") for x in sys.argv[1].split(","))
            victim = None
            while victim is None:
                done = [n for n in os.listdir(sys.argv[2]) if n in pids]
                victim = done[0] if done else None
                time.sleep(0.05)
            os.kill(int(pids[victim]), signal.SIGKILL)
            print("KILLED", victim, flush=True)
            for c, fs in enumerate(chains):
                for k, f in enumerate(fs, 1):
                    a = f.result(timeout=90)
                    want = c + k * (k + 1) / 2
                    assert a.shape == (1_000_000,) and a[0] == a[-1] == want, (c, k, a[0])
            print("CHAINS OK", flush=True)
""")


@pytest.mark.timeout(180)
def test_a_worker_node_sigkilled_mid_chain_of_8mb_arrays_loses_no_result(tmp_path):
    c = start_cluster(tmp_path, n_nodes=3, head_cpus=0)
    try:
        workers = c.nodes[1:]
        ran = tmp_path / "ran"
        ran.mkdir()
        pids = ",".join(f"{n.address}={n.pid}" for n in workers)
        out = c.run_script(CHAINS, tmp_path, pids, str(ran), timeout=150)
        assert out.returncode == 0, out.stderr[-4000:]
        assert "CHAINS OK" in out.stdout
        killed = [x.split()[1] for x in out.stdout.splitlines() if x.startswith("KILLED")]
        assert killed and killed[0] in {n.address for n in workers}, out.stdout
    finally:
        stop_cluster(c)
    for n in workers:  # nothing of the killed node (nor of the other) is left in /dev/shm
        assert not [s for s in os.listdir("/dev/shm") if s.startswith(f"dpool_{n.pid}_")]


REBUILD = textwrap.dedent('''
    import os, signal, sys, time
    import numpy as np
    import dpool
    from dpool.errors import ObjectLostError

    def note(path, what):
        with open(path, "a") as f:
            f.write(what + "\\n")

    def link(a, k, path):
        note(path, f"link{k}")
        time.sleep(0.5)
        return a + k

    @dpool.no_rebuild
    def charge(x, path):
        note(path, f"charge{x}")
        time.sleep(1.5)
        return x

    if __name__ == "__main__":
        with dpool.ProcessPoolExecutor() as ex:
            notes = sys.argv[2]
            fs = [ex.submit(link, np.zeros(1_000_000), 1, notes)]
            for k in range(2, 6):
                fs.append(ex.submit(link, fs[-1], k, notes))
            charged = [ex.submit(charge, i, notes) for i in range(2)]
            time.sleep(0.8)
            os.kill(int(sys.argv[1]), signal.SIGKILL)
            last = fs[-1].result(timeout=90)
            print("LAST", float(last[0]), float(last[-1]), flush=True)
            for f in charged:
                try:
                    f.result(timeout=60)
                    print("CHARGE ran", flush=True)
                except ObjectLostError as exc:
                    print("CHARGE lost", exc.object_id == f._oid, "no_rebuild" in str(exc),
                          flush=True)
''')


@pytest.mark.timeout(150)
def test_a_tcp_drivers_lost_links_run_again_and_no_rebuild_functions_do_not(tmp_path):
    c = start_cluster(tmp_path, n_nodes=2)
    try:
        victim = c.nodes[1]
        notes = tmp_path / "notes.txt"
        notes.write_text("")
        # DPOOL_ADDRESS lists where to go when the first node dies
        env = c.driver_env(DPOOL_ADDRESS=f"{victim.address},{c.head.address}",
                           DPOOL_STATE_DIR=str(tmp_path / "driver-state"))
        out = c.run_script(REBUILD, tmp_path, str(victim.pid), str(notes), env=env,
                           timeout=120)
        assert out.returncode == 0, out.stderr[-4000:]
        lines = out.stdout.splitlines()
        assert "LAST 15.0 15.0" in lines, out.stdout  # 1+2+3+4+5, every link
        ran = notes.read_text().split()
        assert {f"link{k}" for k in range(1, 6)} <= set(ran)
        assert len([x for x in ran if x.startswith("link")]) > 5  # some ran again
        # a charge() the dead node started is not run again: its future says so
        lost = lines.count("CHARGE lost True True")
        assert lost + lines.count("CHARGE ran") == 2, out.stdout
        assert lost >= 1, out.stdout
        for x in ("charge0", "charge1"):
            assert ran.count(x) <= 1, ran
    finally:
        stop_cluster(c)


def test_no_rebuild_marks_functions_and_refuses_what_it_cannot_mark():
    from dpool.runtime import no_rebuild
    from dpool.runtime._rebuild import rebuilds

    def f(x):
        return x

    assert rebuilds(f)
    assert no_rebuild(f) is f and not rebuilds(f)
    with pytest.raises(TypeError, match="takes a function"):
        no_rebuild(3)
    with pytest.raises(TypeError, match="cannot mark"):
        no_rebuild(len)


# -- one host: a lineage rebuild under memory pressure -----------------------------------

MB = 1 << 20


def _make(i, log):
    with open(log, "a") as fh:
        fh.write(f"make{i}\n")
    time.sleep(0.3)  # a rebuild ends after every reader is queued
    return np.full(4 * MB // 8, float(i))  # 4 MiB: three fit in the 12.5 MiB store


def _first_slowly(a):
    time.sleep(0.2)  # slower than a restore: the later readers queue up behind it
    return float(a[0])


def _spill_files() -> list[str]:
    pattern = os.path.join(tempfile.gettempdir(), f"dpool-spill-{os.getpid()}-*", "*")
    return glob.glob(pattern)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cut", [False, True], ids=["spilled", "spill-files-cut-short"])
def test_readers_of_spilled_and_rebuilt_results_wait_for_room(tmp_path, cut):
    # Five 4 MiB results in a store that holds three (two spill), then five tasks that
    # each read one. The readers queued behind the first ones pin the resident values:
    # a reader whose input was on disk found no room to bring it back, and -- with the
    # spill files cut short (a tmp cleaner, a full disk) -- a rebuilt result found no
    # room to be stored; both failed with ObjectStoreFullError ("only 0 bytes can be
    # evicted") instead of waiting for the readers ahead of them to finish.
    log = str(tmp_path / "runs")
    with ProcessPoolExecutor(2, object_store_memory=25 * MB // 2) as ex:
        fs = [ex.submit(_make, i, log) for i in range(5)]
        assert [f.result(30)[0] for f in fs] == [0.0, 1.0, 2.0, 3.0, 4.0]
        files = _spill_files()
        assert len(files) >= 2
        if cut:
            for path in files:
                os.truncate(path, os.path.getsize(path) // 2)
        readers = [ex.submit(_first_slowly, f) for f in fs]
        assert [r.result(30) for r in readers] == [0.0, 1.0, 2.0, 3.0, 4.0]
        with open(log) as fh:
            made = fh.read().split()
        assert len(made) == 5 + (len(files) if cut else 0), made  # each lost one once more
        del fs, readers
        gc.collect()
        ex.submit(int).result(30)  # the releases are applied at the next event
        assert _spill_files() == []  # nothing is left on disk once the results are gone


def _first(a):
    return float(a[0])


def _read_nested(a, b, c, boxed):
    import dpool

    return dpool.get_executor().submit(_first, boxed[0]).result(30)


@pytest.mark.timeout(60)
def test_a_room_wait_that_could_never_end_fails_typed():
    # The outer task pins three resident 4 MiB inputs (12 of the 12.5 MiB store) and
    # waits on a nested reader of a spilled one, which finds no room: the only pins that
    # could make room belong to the task waiting on it. Waiting would never end, so the
    # reader fails with ObjectStoreFullError (and the outer task with it) at once.
    from dpool import ObjectStoreFullError

    with ProcessPoolExecutor(2, object_store_memory=25 * MB // 2) as ex:
        fs = [ex.submit(np.full, 4 * MB // 8, float(i)) for i in range(5)]
        assert [f.result(30)[0] for f in fs] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert len(_spill_files()) >= 2
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreFullError, match="pinned by tasks"):
            ex.submit(_read_nested, fs[2], fs[3], fs[4], [fs[0].object_ref]).result(40)
        assert time.monotonic() - t0 < 20  # (the nested result(30) would time out first)
        assert ex.submit(_first, fs[0]).result(30) == 0.0  # the pool and store still work


def _make_after(event_path):
    while not os.path.exists(event_path):  # the readers are queued behind this task
        time.sleep(0.01)
    return np.full(4 * MB // 8, 9.0)


@pytest.mark.timeout(60)
def test_queued_readers_pin_nothing_until_they_start(tmp_path):
    # One worker runs a task that returns 4 MiB while three readers of the three
    # resident 4 MiB values (12 of the 12.5 MiB store) wait in the queue behind it. A
    # queued task used to pin its inputs from the moment it was queued: the running
    # task's result found every byte pinned and failed with ObjectStoreFullError ("only
    # 0 bytes can be evicted"). Inputs are pinned when a task is sent to its worker: the
    # result evicts one value to disk, and its reader brings it back when it starts.
    # Nor may they be sent ahead to the busy worker (pinning there): ``_first`` is known
    # to be quick, which lets queued tasks go to a busy worker in a batch.
    go = str(tmp_path / "go")
    with ProcessPoolExecutor(1, object_store_memory=25 * MB // 2) as ex:
        assert [f.result(30) for f in [ex.submit(_first, [i]) for i in range(20)]] == \
            list(range(20))
        fs = [ex.submit(np.full, 4 * MB // 8, float(i)) for i in range(3)]
        assert [f.result(30)[0] for f in fs] == [0.0, 1.0, 2.0]
        assert _spill_files() == []
        made = ex.submit(_make_after, go)
        readers = [ex.submit(_first, f) for f in fs]
        open(go, "w").close()
        assert made.result(30)[0] == 9.0
        assert [r.result(30) for r in readers] == [0.0, 1.0, 2.0]
