"""A placement policy loaded by a real loopback cluster (``dpool start --head
--placement-policy module:Class``): the global scheduler places every spilled task with
it, and a task it can never place fails with ``dpool.PlacementError``."""

from __future__ import annotations

import textwrap

import pytest

from tests.cluster.conftest import dpool_cli, start_cluster, stop_cluster

POLICY = "tests.placement._policies:Last"


@pytest.fixture(scope="module")
def last_cluster(tmp_path_factory):
    """A head without CPUs (everything spills) and two 2-CPU nodes, placed by ``Last``."""
    c = start_cluster(tmp_path_factory.mktemp("placement"), head_cpus=0, shards=1,
                      extra=("--placement-policy", POLICY))
    try:
        yield c
    finally:
        stop_cluster(c)


def test_a_bad_policy_is_refused_at_start(tmp_path):
    from tests.cluster.conftest import base_env

    env = base_env()
    env["DPOOL_STATE_DIR"] = str(tmp_path / "state")
    for spec, why in (("nonsense", "expected 'module:Class'"),
                      ("tests.placement._policies:Nope", "has no 'Nope'")):
        out = dpool_cli(["start", "--head", "--port", "1", "--placement-policy", spec], env)
        assert out.returncode == 2 and why in out.stderr, out.stderr
    assert not (tmp_path / "state" / "cluster.json").exists()  # nothing was started


@pytest.mark.timeout(180)
def test_the_clusters_policy_places_every_spilled_task(last_cluster, tmp_path):
    code = textwrap.dedent("""
        import collections, os, sys, time
        import dpool

        def where(x):
            time.sleep(0.1)
            return x + 1, os.environ.get("DPOOL_NODE_ID")

        if __name__ == "__main__":
            with dpool.ProcessPoolExecutor(4) as ex:
                out = list(ex.map(where, range(16)))
                print([v for v, _ in out])
                print(sorted(collections.Counter(n for _, n in out).items()))
                try:
                    ex.options(resources={"unicorn": 1}).submit(where, 0).result(60)
                except dpool.PlacementError as exc:
                    print("PlacementError", isinstance(exc, dpool.ResourceError), exc)
    """)
    out = last_cluster.run_script(code, tmp_path, env=last_cluster.driver_env(
        DPOOL_RESOURCE_GRACE_S="30"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str(list(range(1, 17)))
    last = max(n.address for n in last_cluster.nodes[1:])
    # the built-in rule would use both 2-CPU nodes for 16 tasks of 0.1 s; Last uses one
    assert lines[1] == str([(last, 16)]), out.stderr
    assert lines[2].startswith("PlacementError True") and "policy Last: no node can hold" \
        in lines[2] and "unicorn" in lines[2], lines
