"""Versions checked at the door: a driver or a node whose dpool, Python or cloudpickle
version differs from the cluster's is refused when it connects, with both versions and
both hosts named. (The other version is this process's own build with one field changed
before it connects: the check, the refusal and the messages are the real ones.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from tests.cluster.conftest import TIMEOUT, start_cluster, stop_cluster


@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("versions"), n_nodes=1, shards=1)
    try:
        yield c
    finally:
        stop_cluster(c)


def test_a_driver_of_another_cloudpickle_version_is_refused(one_node, tmp_path):
    out = one_node.run_script(textwrap.dedent("""
        import cloudpickle
        import dpool
        from dpool.protocol import auth

        auth.build()["cloudpickle"] = "0.0.1"
        try:
            with dpool.ProcessPoolExecutor(1) as ex:
                ex.submit(abs, -1).result(30)
            print("NOT REFUSED")
        except dpool.errors.ProtocolError as e:
            print("REFUSED", e)
            print("MINE", cloudpickle.__version__)
    """), tmp_path)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert "REFUSED" in lines, out.stdout + out.stderr
    why = lines["REFUSED"]
    assert "refused this process" in why and "cloudpickle differs" in why
    assert f"cloudpickle {lines['MINE']}" in why and "cloudpickle 0.0.1" in why
    assert why.count(f"host {socket.gethostname()} ") == 2  # both hosts named


def test_a_node_of_another_python_version_cannot_join(one_node, tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from dpool.protocol import auth

        auth.build()["python"] = "3.99"
        sys.argv = ["dpool.node", "--node-ip", "127.0.0.1", "--port", "0", "--unix-path",
                    {str(tmp_path / "node.sock")!r}, "--join", {one_node.head.address!r},
                    "--num-cpus", "1"]
        import runpy
        runpy.run_module("dpool.node", run_name="__main__")
    """)
    env = {**one_node.driver_env(), "DPOOL_TOKEN": one_node.token}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=TIMEOUT)
    assert out.returncode != 0
    assert "python differs" in out.stderr and "python 3.99" in out.stderr, out.stderr
    v = "%d.%d" % sys.version_info[:2]
    assert f"python {v}" in out.stderr
