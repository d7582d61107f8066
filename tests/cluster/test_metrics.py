"""A node's Prometheus endpoint, scraped for real: ``dpool start --head --metrics-port P``;
``/health`` answers anyone, ``/metrics`` only the cluster token, in the text exposition
format that ``prometheus_client``'s own parser reads, with counts that follow the tasks
run."""

from __future__ import annotations

import textwrap
import urllib.error
import urllib.request

import pytest

from tests.cluster.conftest import Cluster, free_port, host, start_node, stop_cluster

parser = pytest.importorskip("prometheus_client.parser")


@pytest.fixture(scope="module")
def head_with_metrics(tmp_path_factory):
    port = free_port(host(2))
    head, token = start_node(tmp_path_factory.mktemp("metrics"), host(2), head=True,
                             num_cpus=2, extra=("--shards", "1", "--metrics-port", str(port)))
    c = Cluster(head, token, [head])
    try:
        yield c, f"http://{host(2)}:{port}"
    finally:
        stop_cluster(c)


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _samples(text: str) -> dict:
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_health_and_metrics(head_with_metrics, tmp_path):
    c, base = head_with_metrics
    assert _get(base + "/health") == (200, "ok\n")
    status, _ = _get(base + "/metrics")
    assert status == 401
    assert _get(base + "/metrics", "wrong-token")[0] == 401
    status, text = _get(base + "/metrics", c.token)
    assert status == 200
    before = _samples(text)
    out = c.run_script(textwrap.dedent("""
        import dpool

        def ok(x):
            return x

        def boom():
            raise ValueError("no")

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(2) as ex:
                assert list(ex.map(ok, range(30))) == list(range(30))
                try:
                    ex.submit(boom).result(60)
                except ValueError:
                    pass
    """), tmp_path)
    assert out.returncode == 0, out.stderr
    after = _samples(_get(base + "/metrics", c.token)[1])
    finished = ("dpool_tasks_total", (("outcome", "finished"),))
    failed = ("dpool_tasks_total", (("outcome", "failed"),))
    # (a TCP driver: its tasks go through the node, none to a lent worker)
    assert after[failed] == before.get(failed, 0) + 1
    assert after[finished] >= before.get(finished, 0) + 30
    count = after[("dpool_task_duration_seconds_count", ())]
    assert count == after[finished] + after[failed]
    assert after[("dpool_task_duration_seconds_bucket", (("le", "+Inf"),))] == count
    assert after[("dpool_object_store_bytes", (("kind", "capacity"),))] > 0
    assert after[("dpool_cpus", (("kind", "total"),))] == 2
    assert after[("dpool_nodes_alive", ())] == 1
    assert (("dpool_node_heartbeat_age_seconds", (("node", c.head.address),))) in after
    assert ("dpool_workers", (("state", "busy"),)) in after
