"""Resources in a cluster: three nodes on this machine, one of which declares (fake) GPUs
and a custom resource. GPU tasks go only to it, spilled there at once by the node the
driver is attached to; tasks asking nothing use every node; a request no node can meet
fails with ``ResourceError`` after the grace period (set short here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.cluster.conftest import (
    TIMEOUT,
    Cluster,
    base_env,
    daemon_env,
    dpool_cli,
    host,
    start_node,
    stop_cluster,
    wait_for_nodes,
)

GRACE_S = 8.0  # long enough for a node to join within it (the last test)


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    """Head (``host(2)``) and ``host(3)`` with 2 CPUs each; ``host(4)`` with 2 CPUs,
    2 GPUs and a TPU."""
    tmp = tmp_path_factory.mktemp("gpu")
    with daemon_env(DPOOL_RESOURCE_GRACE_S=str(GRACE_S)):
        head, token = start_node(tmp, host(2), head=True,
                                 extra=("--shards", "1", "--global-schedulers", "1"))
        c = Cluster(head, token, [head])
        try:
            cpu, _ = start_node(tmp, host(3), head=False, address=head.address,
                                token=token)
            c.nodes.append(cpu)
            gpu, _ = start_node(tmp, host(4), head=False, address=head.address,
                                token=token, extra=("--num-gpus", "2",
                                                    "--resources", '{"TPU": 1}'))
            c.nodes.append(gpu)
            wait_for_nodes(c, 3)
        except BaseException:
            stop_cluster(c)
            raise
    try:
        yield c
    finally:
        stop_cluster(c)


def test_gpu_tasks_land_only_on_the_gpu_node(gpu_cluster, tmp_path):
    code = textwrap.dedent("""
        import os, time
        import dpool

        def where(t):
            time.sleep(t)
            return (os.environ.get("DPOOL_NODE_ID"), os.environ.get("CUDA_VISIBLE_DEVICES"),
                    dpool.get_gpu_ids())

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor() as ex:
                cpu = [ex.submit(where, 0.3) for _ in range(36)]
                gpu = [ex.options(num_gpus=1).submit(where, 0.3) for _ in range(6)]
                tpu = ex.options(resources={"TPU": 1}, num_gpus=0.5).submit(where, 0.1)
                g = [f.result(timeout=60) for f in gpu]
                c = [f.result(timeout=60) for f in cpu]
                t = tpu.result(timeout=60)
                print(sorted({n for n, _, _ in g}))
                print(sorted({e for _, e, _ in g}), sorted({i[0] for _, _, i in g}))
                print(sorted({n for n, _, _ in c}))
                print(t[0], len(t[2]))
    """)
    out = gpu_cluster.run_script(code, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    gpu_node = gpu_cluster.nodes[2].address
    assert lines[0] == str([gpu_node]), out.stdout
    assert lines[1] == "['0', '1'] [0, 1]", out.stdout
    assert lines[2] == str(sorted(n.address for n in gpu_cluster.nodes)), out.stdout
    assert lines[3] == f"{gpu_node} 1", out.stdout


def test_an_impossible_request_fails_after_the_grace_period(gpu_cluster, tmp_path):
    code = textwrap.dedent("""
        import time
        from concurrent.futures import FIRST_COMPLETED, wait
        import dpool

        def f():
            return 1

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor() as ex:
                t0 = time.monotonic()  # both wait out their grace period at once
                fs = [ex.options(num_gpus=4).submit(f),
                      ex.options(resources={"FPGA": 1}).submit(f)]
                ended, pending = {}, set(fs)
                while pending:
                    done, pending = wait(pending, timeout=60, return_when=FIRST_COMPLETED)
                    ended.update(dict.fromkeys(done, time.monotonic()))
                    assert done, "no answer within 60 s"
                for fut in fs:
                    try:
                        fut.result(timeout=0)
                    except dpool.ResourceError as e:
                        print(round(ended[fut] - t0, 1), "|", e)
                print(ex.options(num_gpus=2).submit(f).result(timeout=60))
    """)
    out = gpu_cluster.run_script(code, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout
    for line, asked in zip(lines, ("GPU: 4", "FPGA: 1")):
        elapsed, message = line.split(" | ", 1)
        assert GRACE_S <= float(elapsed) < GRACE_S + 15, line
        assert asked in message and "DPOOL_RESOURCE_GRACE_S" in message, message
        assert gpu_cluster.nodes[2].address in message, message  # what the nodes offer
    assert lines[2] == "1"


def test_status_shows_what_each_node_offers(gpu_cluster):
    status = wait_for_nodes(gpu_cluster, 3)
    offers = {n["node_id"]: n["resources"] for n in status["nodes"]}
    gpu_node = gpu_cluster.nodes[2].address
    assert offers[gpu_node]["GPU"] == 2 and offers[gpu_node]["TPU"] == 1, offers
    assert all(offers[n.address]["GPU"] == 0 for n in gpu_cluster.nodes[:2]), offers
    assert all(o["CPU"] == 2 for o in offers.values()), offers
    env = base_env()
    env["DPOOL_STATE_DIR"] = gpu_cluster.head.state_dir
    text = dpool_cli(["status"], env).stdout
    assert "GPU: 2, TPU: 1" in text, text


def test_a_node_that_joins_within_the_grace_period_gets_the_task(gpu_cluster, tmp_path):
    code = textwrap.dedent("""
        import os, time
        import dpool

        def where():
            return os.environ.get("DPOOL_NODE_ID")

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor() as ex:
                f = ex.options(resources={"FPGA": 1}).submit(where)
                print("submitted", flush=True)
                print(f.result(timeout=60))
    """)
    script = tmp_path / "driver_script.py"
    script.write_text(code)
    driver = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                              env=gpu_cluster.driver_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "submitted"
        fpga, _ = start_node(tmp_path, host(5), head=False,
                             address=gpu_cluster.address, token=gpu_cluster.token,
                             extra=("--resources", '{"FPGA": 1}'))
        gpu_cluster.nodes.append(fpga)  # stopped with the cluster
        out, err = driver.communicate(timeout=TIMEOUT)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, err
    assert out.strip() == fpga.address, (out, err)
