"""Large values between a driver attached over TCP and its node (``transfer._push``,
``runtime._tcp_objects``).

The driver has no ``DPOOL_STATE_DIR``, so to it the node is another host: a large put or
argument is pushed into the node's store on a transfer connection, a large result is
pulled from it into the driver's memory, and neither travels on the control connection.
Values must come through intact whatever their layout; a full store, a node or driver
killed mid-upload, and a connection without the token must each end in a clear way with
nothing left in ``/dev/shm``.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.cluster.conftest import (
    TIMEOUT,
    Cluster,
    _kill_tree,
    host,
    start_cluster,
    start_node,
    stop_cluster,
)

SHM = "/dev/shm"
BIG = 512 << 20  # large enough that a kill lands mid-upload on any machine


def _segments() -> dict:
    """Segment name -> owner pid of every dpool segment on this machine."""
    out = {}
    for name in os.listdir(SHM):
        parts = name.split("_")
        if name.startswith("dpool_") and len(parts) == 3 and parts[1].isdigit():
            out[name] = int(parts[1])
    return out


def _received(c: Cluster) -> int:
    """Values the head's node says it received from drivers (its log, a line each)."""
    with open(os.path.join(c.head.state_dir, "node.log")) as f:
        return sum("from a driver in" in line for line in f)


def _incomplete(name: str, size: int) -> bool:
    """Whether the segment lacks some of its value's bytes (all ones when complete)."""
    path = os.path.join(SHM, name)
    if os.path.getsize(path) < size:  # created, not yet sized (memmap refuses it empty)
        return True
    data = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        return int(np.count_nonzero(data[-size:])) < size
    finally:
        del data


@pytest.fixture(scope="module")
def far(tmp_path_factory):
    """A head that runs nothing (0 CPUs; the driver's node) and two nodes of 2 CPUs."""
    c = start_cluster(tmp_path_factory.mktemp("tcpobj"), n_nodes=3, head_cpus=0)
    try:
        yield c
    finally:
        stop_cluster(c)


VALUES = textwrap.dedent("""
    import hashlib, os, sys, time
    import numpy as np
    import dpool

    def values():
        rng = np.random.default_rng(5)
        base = rng.random((1000, 600))
        return {
            "f64": base,
            "fortran": np.asfortranarray(rng.random((700, 500)).astype(np.float32)),
            "strided": base[::3, ::2],
            "i16": rng.integers(-30000, 30000, 400_000, dtype=np.int16),
            "be_u4": np.arange(300_000, dtype=">u4"),
            "c128": rng.random(50_000) + 1j * rng.random(50_000),
            "bool": rng.random(700_000) > 0.5,
            "rec": np.array([(i, i / 2, b"ab") for i in range(40_000)],
                            dtype=[("a", "<i8"), ("b", "<f4"), ("c", "S3")]),
            "bytes": hashlib.sha256(b"x").digest() * 40_000,
            "nested": {"parts": [np.full(70_000 + i, i, dtype=np.uint8) for i in range(40)],
                       "meta": ("x", 3, None)},
        }

    def describe(v):
        if isinstance(v, np.ndarray):
            return ("array", v.dtype.str, v.shape, v.flags.f_contiguous and v.ndim > 1
                    and not v.flags.c_contiguous,
                    hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest())
        if isinstance(v, dict):
            return {k: describe(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [describe(x) for x in v]
        if isinstance(v, bytes):
            return ("bytes", hashlib.sha256(v).hexdigest())
        return v

    def remote_describe(v, i):
        time.sleep(0.1)
        return os.environ["DPOOL_NODE_ID"], describe(v)

    def echo(v):
        return v

    def make(n):
        return np.arange(n, dtype=np.float64)

    if __name__ == "__main__":
        vals = values()
        expect = describe(vals)
        with dpool.ProcessPoolExecutor() as ex:
            ref = dpool.put(vals)
            fs = [ex.submit(remote_describe, ref, i) for i in range(16)]
            nodes = set()
            for f in fs:
                node, got = f.result(timeout=60)
                assert got == expect, (got, expect)
                nodes.add(node)
            print("nodes", len(nodes))
            # a large argument, and large results: result(), dpool.get, writable arrays
            assert ex.submit(remote_describe, vals, 0).result(timeout=60)[1] == expect
            back = ex.submit(echo, ref).result(timeout=60)
            assert describe(back) == expect
            back["f64"][0, 0] = -1.0
            assert back["f64"].flags.writeable and back["fortran"].flags.f_contiguous
            assert describe(dpool.get(ref)) == expect  # the put value, from the node
            f = ex.submit(make, 8_000_000)                                   # 64 MB
            a = dpool.get(f.object_ref, timeout=60)
            assert a.shape == (8_000_000,) and a[-1] == 7_999_999.0
            # over 32 MB in many buffers: it moves in ranges that split buffers
            rng = np.random.default_rng(7)
            big = {"arrs": [rng.integers(0, 255, 1_000_003 + i, dtype=np.uint8)
                            for i in range(40)],
                   "f": np.asfortranarray(rng.random((1000, 1001)))}
            bexp = describe(big)
            bref = dpool.put(big)
            assert ex.submit(remote_describe, bref, 0).result(timeout=60)[1] == bexp
            assert describe(ex.submit(echo, bref).result(timeout=60)) == bexp
            many = dpool.get([ex.submit(make, 1_000_000 + i) for i in range(6)])
            assert [len(x) for x in many] == [1_000_000 + i for i in range(6)]
            assert all(x[-1] == len(x) - 1 for x in many)
        with dpool.Pool(2) as p:
            out = p.map(make, [2_000_000 + i for i in range(8)])
            assert [len(x) for x in out] == [2_000_000 + i for i in range(8)]
            assert all(np.array_equal(x, np.arange(len(x), dtype=np.float64)) for x in out)
            out = p.map(echo, [vals["nested"]] * 3)
            assert all(describe(x) == expect["nested"] for x in out)
        print("OK")
""")


@pytest.mark.timeout(180)
def test_large_values_to_and_from_a_tcp_driver_are_intact(far, tmp_path):
    before = _received(far)
    out = far.run_script(VALUES, tmp_path, timeout=150)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "nodes 2", out.stdout  # the put was used on both nodes
    assert lines[1] == "OK", out.stdout
    # the put and the large argument went on transfer connections, not inline
    assert _received(far) - before >= 2


SMALL = textwrap.dedent("""
    import numpy as np
    import dpool

    def size(a):
        return a.nbytes

    if __name__ == "__main__":
        with dpool.ProcessPoolExecutor() as ex:
            small = np.ones(1000)
            assert dpool.get(dpool.put(small)).sum() == 1000
            assert ex.submit(size, small).result(timeout=60) == 8000
            assert ex.submit(np.ones, 100).result(timeout=60).sum() == 100
        print("OK")
""")


@pytest.mark.timeout(120)
def test_small_values_stay_inline(far, tmp_path):
    before = _received(far)
    out = far.run_script(SMALL, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK"
    assert _received(far) == before


UPLOAD = textwrap.dedent("""
    import sys
    import numpy as np
    import dpool

    if __name__ == "__main__":
        big = np.ones(int(sys.argv[1]), dtype=np.uint8)
        print("READY", flush=True)
        try:
            dpool.put(big)
        except dpool.NodeLostError as e:
            print("NODE LOST", e, flush=True)
        else:
            print("PUT", flush=True)
""")


def _await_upload(owner: int, before: set, driver: subprocess.Popen) -> str:
    """The segment a driver's upload is being received into on the node ``owner``."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and driver.poll() is None:
        seg = next((n for n, pid in _segments().items()
                    if pid == owner and n not in before), None)
        if seg is not None:
            return seg
        time.sleep(0.001)
    raise AssertionError(driver.communicate(timeout=TIMEOUT))


@pytest.mark.timeout(180)
def test_a_driver_killed_mid_upload_leaves_no_segment(far, tmp_path):
    script = tmp_path / "upload.py"
    script.write_text(UPLOAD)
    before = set(_segments())
    driver = subprocess.Popen([sys.executable, str(script), str(BIG)], cwd=tmp_path,
                              env=far.driver_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "READY"  # type: ignore[union-attr]
        seg = _await_upload(far.head.pid, before, driver)
        driver.send_signal(signal.SIGSTOP)
        assert _incomplete(seg, BIG), "the upload had finished before the driver stopped"
        driver.kill()
        driver.communicate(timeout=TIMEOUT)
        deadline = time.monotonic() + 10
        while os.path.exists(os.path.join(SHM, seg)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(os.path.join(SHM, seg))  # the partial copy, removed
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    # the node keeps serving TCP drivers
    out = far.run_script(SMALL, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr


@pytest.mark.timeout(180)
def test_the_node_killed_mid_upload_is_a_typed_error(tmp_path):
    c = start_cluster(tmp_path, n_nodes=2, head_cpus=0)
    head, other = c.head, c.nodes[1]
    before = set(_segments())
    script = tmp_path / "upload.py"
    script.write_text(UPLOAD)
    driver = subprocess.Popen([sys.executable, str(script), str(BIG)], cwd=tmp_path,
                              env=c.driver_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    killed = False
    try:
        assert driver.stdout.readline().strip() == "READY"  # type: ignore[union-attr]
        seg = _await_upload(head.pid, before, driver)
        os.kill(head.pid, signal.SIGSTOP)
        assert _incomplete(seg, BIG), "the upload had finished before the node stopped"
        _kill_tree(head.pid)
        killed = True
        t0 = time.monotonic()
        out, err = driver.communicate(timeout=TIMEOUT)
        assert time.monotonic() - t0 < 20  # no hang
        assert driver.returncode == 0, err
        assert out.startswith("NODE LOST"), (out, err)
        left = {n for n, pid in _segments().items() if n not in before and pid == other.pid}
        assert not left, left  # the surviving node holds nothing of it
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
        if not killed:
            _kill_tree(head.pid)
        c.nodes.remove(head)
        stop_cluster(c)  # (the head's shards and global scheduler too)
        for n, pid in _segments().items():  # what the killed node held (its host's)
            if n not in before and pid == head.pid:
                os.unlink(os.path.join(SHM, n))


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    """A one-node cluster whose store holds 32 MB."""
    tmp = tmp_path_factory.mktemp("smallstore")
    head, token = start_node(tmp, host(2), head=True, num_cpus=1,
                             extra=("--object-store-memory", str(32 << 20)))
    c = Cluster(head, token, [head])
    try:
        yield c
    finally:
        for n in c.nodes:
            n.stop()


FULL = textwrap.dedent("""
    import numpy as np
    import dpool

    def first(a):
        return float(a[0])

    if __name__ == "__main__":
        big = np.ones(64 << 17)  # 64 MB
        with dpool.ProcessPoolExecutor() as ex:
            try:
                dpool.put(big)
            except dpool.ObjectStoreFullError as e:
                print("PUT FULL", "capacity" in str(e))
            try:
                ex.submit(first, big).result(timeout=60)
            except dpool.ObjectStoreFullError as e:
                print("ARG FULL")
            ref = dpool.put(np.full(2 << 20, 2.0))  # 16 MB: fits
            print("SMALLER", ex.submit(first, ref).result(timeout=60))
""")


@pytest.mark.timeout(120)
def test_a_full_store_is_a_typed_error(small_store, tmp_path):
    out = small_store.run_script(FULL, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["PUT FULL True", "ARG FULL", "SMALLER 2.0"]


@pytest.mark.timeout(60)
def test_an_upload_without_the_token_is_refused(small_store):
    from dpool.errors import AuthenticationError, Error
    from dpool.objects._serialization import serialize
    from dpool.protocol import PROTOCOL_VERSION, encode_batch
    from dpool.protocol import _messages as m
    from dpool.transfer import _push

    host, port = small_store.address.rsplit(":", 1)
    before = set(_segments())
    ser = serialize(np.ones(1 << 18), oob_threshold=1024)
    oid = (7 << 40) + 1
    with pytest.raises(AuthenticationError):
        _push.push(host, int(port), b"not the token", oid, ser, timeout=5)
    # the token, but an object id that is no attached driver's: refused, nothing stored
    with pytest.raises(Error, match="refused"):
        _push.push(host, int(port), small_store.token.encode(), oid, ser, timeout=5)
    # a raw request with no handshake at all: the connection is closed, nothing read
    with socket.create_connection((host, int(port)), timeout=5) as s:
        body = encode_batch([m.PushSegment(PROTOCOL_VERSION, oid, 1 << 21)])
        s.sendall(struct.pack("!Q", len(body)) + body + bytes(1 << 16))
        s.settimeout(5)
        try:
            while s.recv(1 << 16):
                pass
        except ConnectionResetError:
            pass
    assert set(_segments()) - before == set()


PARTIAL = textwrap.dedent("""
    import os, time
    import numpy as np
    import dpool
    from dpool.objects import _segment
    from dpool.transfer import _push
    from dpool.objects._serialization import serialize
    from dpool.runtime._current import client

    def shm():
        return {n for n in os.listdir("/dev/shm") if n.startswith("dpool_")}

    def upload(n):
        ser = serialize(np.ones(n, dtype=np.uint8), oob_threshold=1024)
        views = [_segment._as_bytes_view(b) for b in ser.buffers]
        layout = _segment._layout(len(ser.meta), [v.nbytes for v in views])
        t = rt.target
        return _push._Upload(t.host, t.port, t.token, rt.new_id(), layout.size,
                             _push._parts(layout, ser.meta, views), 10)

    if __name__ == "__main__":
        dpool.put(1)  # attached
        rt = client()
        # the driver gives up after the first of two ranges: the node drops the value
        up = upload(48 << 20)
        before = shm()
        sock = up._open(0, 16 << 20)
        # the upload's segment (its name ends in the object id): other tests running
        # meanwhile make segments of their own
        during = {n for n in shm() - before if n.endswith(f"_{up.object_id:x}")}
        up._send(sock, 0, 16 << 20)
        sock.close()
        deadline = time.monotonic() + 10
        while shm() & during and time.monotonic() < deadline:
            time.sleep(0.05)
        print("DROPPED", len(during), sorted(shm() & during))
        # a range of an upload that is not under way is refused
        try:
            upload(48 << 20)._open(16 << 20, 16 << 20)
        except dpool.Error as e:
            print("REFUSED", "no upload" in str(e))
        ref = dpool.put(np.ones(48 << 20, dtype=np.uint8))  # the node still takes them
        print("PUT", int(dpool.get(ref).sum()) == 48 << 20)
""")


@pytest.mark.timeout(120)
def test_an_upload_given_up_part_way_leaves_nothing(far, tmp_path):
    out = far.run_script(PARTIAL, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["DROPPED 1 []", "REFUSED True", "PUT True"]


ASK_AGAIN = textwrap.dedent("""
    import numpy as np
    import dpool
    from dpool.transfer import _pull

    real = _pull.fetch_into
    calls = []

    def gone_once(*a, **k):  # as if the node had spilled the result to its disk
        calls.append(1)
        if len(calls) == 1:
            raise _pull.Gone("not there (test)")
        return real(*a, **k)

    def always_gone(*a, **k):
        raise _pull.Gone("not there (test)")

    def make(n):
        return np.arange(n, dtype=np.float64)

    if __name__ == "__main__":
        with dpool.ProcessPoolExecutor() as ex:
            _pull.fetch_into = gone_once
            a = ex.submit(make, 1 << 20).result(timeout=60)
            print("AGAIN", len(calls), a[-1] == (1 << 20) - 1)
            _pull.fetch_into = always_gone
            try:
                ex.submit(make, 1 << 20).result(timeout=60)
            except dpool.ObjectLostError as e:
                print("LOST", "not there (test)" in str(e))
""")


@pytest.mark.timeout(120)
def test_a_result_not_on_the_node_is_asked_for_again(far, tmp_path):
    out = far.run_script(ASK_AGAIN, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["AGAIN 2 True", "LOST True"]


FORKS = textwrap.dedent("""
    import threading, time
    import numpy as np
    import dpool

    def one(x):
        return x

    if __name__ == "__main__":
        arr = np.ones(48 << 20, dtype=np.uint8)  # over 32 MB: in ranges
        dpool.put(1)
        done, errors = [], []

        def puts():
            try:
                for _ in range(8):
                    ref = dpool.put(arr)
                    done.append(1)
                    del ref
            except BaseException as e:  # noqa: BLE001
                errors.append(repr(e))

        t0 = time.monotonic()
        t = threading.Thread(target=puts)
        t.start()
        while t.is_alive():  # a fresh worker per task: the node forks all along
            with dpool.ProcessPoolExecutor(2, max_tasks_per_child=1) as ex:
                list(ex.map(one, range(4)))
        t.join()
        print(len(done), errors, time.monotonic() - t0 < 20)
""")


@pytest.mark.timeout(120)
def test_uploads_while_the_node_forks_workers(cluster, tmp_path):
    """The node's segment writers hold off its forks (``_forkguard``); an upload in
    ranges must never make a fork and its own ranges wait on each other."""
    out = cluster.run_script(FORKS, tmp_path, timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "8 [] True", out.stdout
