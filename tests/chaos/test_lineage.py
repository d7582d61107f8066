"""Lineage rebuilds (issue 17, item 3): values whose only copy died with a node come
back by running again the tasks that made them, through their inputs; a function marked
``dpool.no_rebuild`` is not run again and its future fails with
``ObjectLostError``.

Two loopback clusters: a head with no CPUs whose driver (on the head's host) sends
every task to the two other nodes, one of which is SIGKILLed mid-way through chains of
dependent tasks passing 8 MB arrays; and two nodes whose TCP driver loses its own node
while a chain runs (the driver moves, ``_move``, and runs the lost links again).
"""

from __future__ import annotations

import os
import textwrap

import pytest

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
