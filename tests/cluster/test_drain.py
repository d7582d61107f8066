"""Walltime: a node told to stop (SIGTERM, as Slurm and Kubernetes send before a kill)
takes no more tasks, lets its running ones finish for its grace period, and hands what is
still running then back to the tasks' origins, which run them elsewhere without charging
an attempt -- so with ``max_attempts=1`` nothing fails. Real daemons, a real SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from tests.cluster.conftest import TIMEOUT, start_cluster, stop_cluster

PROGRAM = textwrap.dedent("""
    import os, sys, time
    import dpool

    def work(t, marks):
        node = os.environ.get("DPOOL_NODE_ID")
        open(os.path.join(marks, f"{time.monotonic():.6f} {node}"), "w").close()
        time.sleep(t)
        return os.environ.get("DPOOL_NODE_ID")

    if __name__ == "__main__":
        victim, seconds, marks = sys.argv[1], float(sys.argv[2]), sys.argv[3]
        there = dpool.NodeAffinity(victim, soft=True)
        with dpool.ProcessPoolExecutor(4, max_attempts=1) as ex:
            fs = [ex.options(scheduling=there).submit(work, seconds, marks) for _ in range(2)]
            while len(os.listdir(marks)) < 2:  # (both run, on the victim)
                time.sleep(0.02)
            print("SIGTERM", flush=True)
            sys.stdin.readline()
            for f in fs:
                try:
                    print("OK", f.result(timeout=60))
                except Exception as e:
                    print("FAILED", type(e).__name__, e)
""")


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("drain"), n_nodes=3, shards=1,
                      node_extra=("--drain-grace", "1"))
    try:
        yield c
    finally:
        stop_cluster(c)


def _run(c, tmp_path, victim: str, seconds: float) -> subprocess.Popen:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(script), victim, str(seconds), str(marks)],
                            env=c.driver_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "SIGTERM", proc.stderr.read()
        return proc
    except BaseException:
        proc.kill()
        raise


def test_running_tasks_past_the_grace_period_go_elsewhere_uncharged(three_nodes, tmp_path):
    c = three_nodes
    victim = c.nodes[2]
    proc = _run(c, tmp_path, victim.address, 4.0)
    node = psutil.Process(victim.pid)
    node.send_signal(signal.SIGTERM)  # grace 1 s: the 4 s tasks cannot finish there
    out, err = proc.communicate("\n", timeout=TIMEOUT)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and all(x.startswith("OK ") for x in lines), out + err
    assert all(x.split()[1] != victim.address for x in lines)  # they ran again elsewhere
    starts = sorted(os.listdir(tmp_path / "marks"))  # "time node", in start order
    assert [x.split()[1] for x in starts[:2]] == [victim.address] * 2  # first: the victim
    assert len(starts) == 4  # then once more each, elsewhere
    node.wait(TIMEOUT)  # the node exits after handing them back


def test_a_stopping_node_finishes_what_fits_in_its_grace(three_nodes, tmp_path):
    c = three_nodes
    victim = c.nodes[1]
    proc = _run(c, tmp_path, victim.address, 0.3)
    psutil.Process(victim.pid).send_signal(signal.SIGTERM)
    out, err = proc.communicate("\n", timeout=TIMEOUT)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines == [f"OK {victim.address}"] * 2, out + err
    assert len(os.listdir(tmp_path / "marks")) == 2  # each ran once
