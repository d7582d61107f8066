"""Actors on a real two-node cluster: created by a driver (on its node's host, or over
TCP), called by the driver and by tasks that run on the other node, restarted with their
state, killed; ``ActorDiedError`` where they are gone."""

from __future__ import annotations

import textwrap

import pytest

from tests.cluster.conftest import TIMEOUT, Cluster, daemon_env, start_cluster, stop_cluster

pytestmark = pytest.mark.timeout(2 * TIMEOUT)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """The head (``host(2)``, 2 CPUs) and ``host(3)`` (2 CPUs and 2 "OTHER"): a task
    that asks for "OTHER" runs on ``host(3)``. What no node has fails after 2 s."""
    tmp = tmp_path_factory.mktemp("actors")
    with daemon_env(DPOOL_RESOURCE_GRACE_S="2"):
        c = start_cluster(tmp, n_nodes=2, shards=1,
                          node_extra=("--resources", '{"OTHER": 2}'))
    try:
        yield c
    finally:
        stop_cluster(c)


COMMON = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import dpool
    from dpool import ProcessPoolExecutor

    class Counter:
        def __init__(self, start):
            self.n = start
            self.seen = []

        def add(self, k):
            self.n += k
            self.seen.append(k)
            return self.n

        def history(self):
            return self.seen

        def pid(self):
            return os.getpid()

        def node(self):
            return os.environ.get("DPOOL_NODE_ID")

        def ones(self, n):
            return np.ones(n)

        def fail(self):
            raise KeyError("no such thing")

    def node():
        return os.environ.get("DPOOL_NODE_ID")

    def call_many(counter, n):
        fs = [counter.add.submit(i) for i in range(n)]
        return node(), [f.result() for f in fs]

    def big_sum(counter, n):
        return node(), float(counter.ones(n).sum())

    class Caller:  # an actor that calls another
        def __init__(self, counter):
            self.counter = counter

        def call(self, n):
            return call_many(self.counter, n)

    def nested(counter):  # an executor made in a task is an embedded runtime of its own
        with ProcessPoolExecutor(1) as inner:
            try:
                inner.submit(call_many, counter, 1).result()
            except dpool.ActorDiedError as e:
                return "cannot reach" in str(e)
""")


def _run(c: Cluster, tmp_path, body: str, on_host: bool = False):
    env = c.driver_env(DPOOL_STATE_DIR=c.head.state_dir) if on_host else None
    out = c.run_script(COMMON + textwrap.dedent(body), tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line]


@pytest.mark.parametrize("on_host", [True, False], ids=["unix-driver", "tcp-driver"])
def test_a_drivers_actor_keeps_its_state_and_raises_its_errors(two_nodes, tmp_path, on_host):
    lines = _run(two_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                c = ex.actor(Counter, 10)
                print(c.add(1), c.add.submit(2).result())
                fs = [c.add.submit(1) for _ in range(200)]
                print(fs[-1].result(timeout=30), c.history()[-3:])
                try:
                    c.fail()
                except KeyError as e:
                    print("KeyError", e, "Traceback" in str(e.__cause__))
                print(c.add(0))  # it lives on
                print(ex.submit(call_many, c, 2).result(timeout=30)[1])
    """, on_host)
    assert lines[0] == "11 13"
    assert lines[1] == "213 [1, 1, 1]"
    assert lines[2] == "KeyError 'no such thing' True"
    assert lines[3] == "213"
    assert lines[4] == "[213, 214]"


def test_tasks_on_another_node_call_the_actor_in_order(two_nodes, tmp_path):
    lines = _run(two_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                c = ex.actor(Counter, 0)
                other = ex.options(resources={"OTHER": 1})
                where, values = other.submit(call_many, c, 100).result(timeout=30)
                print(where == "%s", values == [sum(range(i + 1)) for i in range(100)])
                print(c.history() == list(range(100)))
                # a large result crosses to the caller's node (pulled, not inline)
                print(other.submit(big_sum, c, 400_000).result(timeout=30)[1])
                # and a future of an actor call, read by a task over there
                f = c.ones.submit(300_000)
                print(other.submit(lambda a: float(a.sum()), f).result(timeout=30))
                # a handle held by another actor
                print(ex.actor(Caller, c).call(3)[1])
                # but not in a runtime nested in a task: a clear error, no hang
                print(other.submit(nested, c).result(timeout=30))
    """ % two_nodes.nodes[1].address)
    assert lines[0] == "True True"
    assert lines[1] == "True"
    assert lines[2] == "400000.0"
    assert lines[3] == "300000.0"
    assert lines[4] == "[4950, 4951, 4953]"
    assert lines[5] == "True"


def test_an_actor_restarts_with_its_state_and_a_killed_one_says_so(two_nodes, tmp_path):
    lines = _run(two_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                c = ex.options(max_restarts=1, checkpoint_every=3).actor(Counter, 0)
                for k in (1, 2, 3, 4, 5):
                    c.add(k)
                first = c.pid()
                os.kill(first, signal.SIGKILL)  # (the node is on this host)
                print(c.add(10), c.pid() != first)
                dpool.kill(c)
                try:
                    c.add(1)
                except dpool.ActorDiedError as e:
                    print("ActorDiedError", "killed" in str(e))
                other = ex.options(resources={"OTHER": 1})
                try:
                    other.submit(call_many, c, 1).result(timeout=30)
                except dpool.ActorDiedError as e:
                    print("from the other node: ActorDiedError")
                d = ex.actor(Counter, 0)
                os.kill(d.pid(), signal.SIGKILL)
                try:
                    d.add(1)
                except dpool.ActorDiedError as e:
                    print("ActorDiedError", "max_restarts=0" in str(e),
                          e.actor == repr(d)[len("<ActorHandle "):-1], "#" in e.actor)
    """)
    assert lines == ["25 True", "ActorDiedError True", "from the other node: ActorDiedError",
                     "ActorDiedError True True True"]


def test_named_actors_and_bad_input_on_a_cluster(two_nodes, tmp_path):
    lines = _run(two_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                c = ex.options(name="counter").actor(Counter, 5)
                print(dpool.get_actor("counter").add(1))
                try:
                    ex.options(name="counter").actor(Counter, 0)
                except ValueError as e:
                    print("ValueError", e)
                try:
                    c.nope
                except AttributeError as e:
                    print("AttributeError")
            try:
                c.add(1)
            except dpool.ActorDiedError as e:
                print("after shutdown: ActorDiedError")
    """)
    assert lines == ["6", "ValueError an actor named 'counter' exists already",
                     "AttributeError", "after shutdown: ActorDiedError"]


def test_a_detached_named_actor_outlives_its_driver_and_others_find_it(two_nodes, tmp_path):
    """Driver 1 (on the head) leaves a detached actor behind; driver 2, attached to the
    other node, finds it by name, calls it (from a task too) and kills it; then the name
    is free."""
    first = _run(two_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(1) as ex:
                keeper = ex.options(name="keeper", lifetime="detached").actor(Counter, 100)
                short = ex.options(name="short").actor(Counter, 0)
                print(keeper.add(1), short.add(1))
    """)
    assert first == ["101 1"]
    other = two_nodes.nodes[1]
    env = two_nodes.driver_env(DPOOL_ADDRESS=other.address)
    out = two_nodes.run_script(COMMON + textwrap.dedent("""
        def from_a_task(k):
            return dpool.get_actor("keeper").add(k)

        if __name__ == "__main__":
            keeper = dpool.get_actor("keeper")
            print(keeper.add(1), keeper.history())
            with ProcessPoolExecutor(1) as ex:
                print(ex.submit(from_a_task, 10).result(timeout=30))
                try:
                    ex.options(name="keeper").actor(Counter, 0)
                except ValueError as e:
                    print("taken")
            for name in ("short", "nobody"):
                try:
                    dpool.get_actor(name)
                except ValueError as e:
                    print(e)
            dpool.kill(keeper)
            try:
                keeper.add(1)
            except dpool.ActorDiedError as e:
                print("ActorDiedError")
    """), tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "102 [1, 1]", "112", "taken", "no live actor named 'short'",
        "no live actor named 'nobody'", "ActorDiedError"]
    # the name is free again, on the head too
    again = _run(two_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(1) as ex:
                try:
                    dpool.get_actor("keeper")
                except ValueError:
                    print("gone")
                k = ex.options(name="keeper").actor(Counter, 7)
                print(dpool.get_actor("keeper").add(0))
    """)
    assert again == ["gone", "7"]


def test_a_dpool_manager_serves_tasks_on_every_node(two_nodes, tmp_path):
    lines = _run(two_nodes, tmp_path, """
        def bump(d, lock, q, k):
            with lock:
                d[k] = d.get(k, 0) + 1
            q.put(node())
            return node()

        if __name__ == "__main__":
            with dpool.Manager() as m:
                d, lock, q = m.dict(), m.Lock(), m.Queue()
                with ProcessPoolExecutor(2) as ex:
                    here = [ex.submit(bump, d, lock, q, i % 3) for i in range(12)]
                    there = [ex.options(resources={"OTHER": 1}).submit(bump, d, lock, q, i % 3)
                             for i in range(12)]
                    print(len({f.result(timeout=30) for f in here + there}))
                print(sorted(d.items()), q.qsize())
    """)
    assert lines == ["2", "[(0, 8), (1, 8), (2, 8)] 24"]


def test_an_actor_holds_its_nodes_resources(two_nodes, tmp_path):
    """An actor lives on its driver's node when that node has what it asks, and holds
    it there: a task that needs the same waits until the actor is killed."""
    other = two_nodes.nodes[1]
    env = two_nodes.driver_env(DPOOL_ADDRESS=other.address)
    out = two_nodes.run_script(COMMON + textwrap.dedent("""
        from concurrent.futures import wait

        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                holder = ex.options(resources={"OTHER": 2}).actor(Counter, 0)
                print(holder.add(1), holder.node() == os.environ["DPOOL_ADDRESS"])
                task = ex.options(resources={"OTHER": 1}).submit(node)
                print(len(wait([task], timeout=0.5).done))
                dpool.kill(holder)
                print(task.result(timeout=30) == os.environ["DPOOL_ADDRESS"])
    """), tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["1 True", "0", "True"]


def test_an_actor_its_node_cannot_host_is_placed_by_the_global_scheduler(two_nodes,
                                                                         tmp_path):
    """The driver's node (the head) has no "OTHER": a global scheduler places the actor
    on the node that has it; the driver's calls, and those of tasks on the head (whose
    handle names the head), go there; shutdown ends it there. What no node has fails
    once the resource grace has passed."""
    lines = _run(two_nodes, tmp_path, """
        def call_it(counter, k):
            return node(), counter.add(k)

        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                placed = ex.options(resources={"OTHER": 2}, name="placed").actor(Counter, 0)
                print(placed.add(1), placed.node() == "%s")
                pid = placed.pid()
                print(ex.submit(call_it, placed, 10).result(timeout=30)[1])
                print(placed.history())
                nowhere = ex.options(resources={"NOWHERE": 1}).actor(Counter, 0)
                try:
                    nowhere.add(1)
                except dpool.ActorDiedError as e:
                    print("ActorDiedError", "cannot get its resources" in str(e))
            try:
                dpool.get_actor("placed")
            except ValueError:
                print("ended with its executor")
            import psutil  # (the other node is on this host)
            deadline = time.monotonic() + 20
            while psutil.pid_exists(pid) and time.monotonic() < deadline:
                try:
                    if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.Error:
                    break
                time.sleep(0.05)
            print("its process exited", not psutil.pid_exists(pid) or
                  psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    """ % two_nodes.nodes[1].address)
    assert lines == ["1 True", "11", "[1, 10]", "ActorDiedError True",
                     "ended with its executor", "its process exited True"]


def test_placed_actors_end_however_they_are_ended(two_nodes, tmp_path):
    """A placed actor killed from a task (through its proxy on the head) ends on its node
    and its driver hears of it (the name is free again); one killed while it is still
    being placed never starts; calls fail with ActorDiedError, none hangs."""
    lines = _run(two_nodes, tmp_path, """
        def kill_it(name):
            dpool.kill(dpool.get_actor(name))
            return "sent"

        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                placed = ex.options(resources={"OTHER": 1}, name="p2").actor(Counter, 0)
                print(placed.add(1), placed.node() == "%s")
                print(ex.submit(kill_it, "p2").result(timeout=30))
                try:
                    placed.history.submit().result(timeout=30)
                    placed.history.submit().result(timeout=30)  # (after the kill, if not)
                except dpool.ActorDiedError as e:
                    print("ActorDiedError", "killed" in str(e))
                again = ex.options(resources={"OTHER": 1}, name="p2").actor(Counter, 5)
                print(again.add(1))
                never = ex.options(resources={"NOWHERE": 1}).actor(Counter, 0)
                f = never.add.submit(1)
                dpool.kill(never)
                try:
                    f.result(timeout=30)
                except dpool.ActorDiedError as e:
                    print("ActorDiedError", "killed" in str(e))
    """ % two_nodes.nodes[1].address)
    assert lines == ["1 True", "sent", "ActorDiedError True", "6", "ActorDiedError True"]


def test_scheduling_puts_an_actor_where_it_asks(two_nodes, tmp_path):
    head, other = two_nodes.head.address, two_nodes.nodes[1].address
    lines = _run(two_nodes, tmp_path, """
        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                there = ex.options(scheduling=dpool.NodeAffinity("%s")).actor(Counter, 0)
                here = ex.options(scheduling=dpool.NodeAffinity("%s")).actor(Counter, 0)
                print(there.node() == "%s", here.node() == "%s", there.add(2), here.add(3))
                spread = ex.options(scheduling="spread").actor(Counter, 0)
                print(spread.add(1), spread.node() in ("%s", "%s"))
                nowhere = ex.options(scheduling=dpool.NodeAffinity("127.0.0.9:1")).actor(
                    Counter, 0)
                try:
                    nowhere.add(1)
                except dpool.ActorDiedError as e:
                    print("ActorDiedError", "127.0.0.9:1" in str(e))
    """ % (other, head, other, head, head, other))
    assert lines == ["True True 2 3", "1 True", "ActorDiedError True"]


def test_an_actor_in_a_placement_groups_bundle_runs_where_the_bundle_is(two_nodes,
                                                                         tmp_path):
    """A bundle that only ``host(3)`` can hold ("OTHER"): the actor in it is placed
    there and holds its share (a task in the same bundle waits for it); one in a bundle
    the driver's node holds stays there; removing the group ends both."""
    head, other = two_nodes.head.address, two_nodes.nodes[1].address
    lines = _run(two_nodes, tmp_path, """
        def in_bundle():
            return node()

        if __name__ == "__main__":
            with ProcessPoolExecutor(2) as ex:
                pg = dpool.placement_group([{"CPU": 1, "OTHER": 1}, {"CPU": 1}],
                                           strategy="strict_spread")
                there = ex.options(placement_group=pg, bundle=0, num_cpus=1,
                                   resources={"OTHER": 1}).actor(Counter, 0)
                print(there.add(2), there.node() == "%s")
                waits = ex.options(placement_group=pg, bundle=0, num_cpus=1).submit(in_bundle)
                time.sleep(1.0)
                print("waits", not waits.done())
                here = ex.options(placement_group=pg, bundle=1).actor(Counter, 0)
                print(here.add(3), here.node() == "%s")
                dpool.kill(there)
                print(waits.result(timeout=30) == "%s")
                there2 = ex.options(placement_group=pg, bundle=0).actor(Counter, 0)
                print(there2.add(4))
                pg.remove()
                for h in (there2, here):
                    try:
                        for _ in range(100):
                            h.add(1)
                            time.sleep(0.1)
                        print("still alive")
                    except dpool.ActorDiedError as e:
                        print("ActorDiedError", "placement group" in str(e))
    """ % (other, head, other))
    assert lines == ["2 True", "waits True", "3 True", "True", "4",
                     "ActorDiedError True", "ActorDiedError True"]
