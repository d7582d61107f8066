"""The global scheduler's placement policy, on fake load reports (no processes)."""

from __future__ import annotations

from dpool.global_scheduler._placement import NodeLoad, choose, missing_bytes

MB = 1 << 20


def test_least_estimated_wait_wins_and_the_origin_and_cpuless_nodes_never_do():
    a = NodeLoad("a", cpus=2, busy=2, queued=4, avg_task_s=0.01)
    b = NodeLoad("b", cpus=2, busy=1, avg_task_s=0.01)
    c = NodeLoad("c", cpus=0)
    assert choose([a, b, c], origin="x") is b
    assert choose([a, b, c], origin="b") is a
    assert choose([c], origin="x") is None


def test_pending_placements_spread_a_burst():
    a, b = NodeLoad("a", cpus=1, avg_task_s=0.01), NodeLoad("b", cpus=1, avg_task_s=0.01)
    picks = []
    for _ in range(4):
        n = choose([a, b], origin="x")
        n.pending += 1
        picks.append(n.address)
    assert sorted(picks) == ["a", "a", "b", "b"]


def test_a_node_holding_the_inputs_is_preferred_by_their_transfer_time():
    inputs = (("h:1", "/dpool_9_1", 64 * MB),)
    fresh = NodeLoad("a", cpus=2, avg_task_s=0.001)
    warm = NodeLoad("b", cpus=2, avg_task_s=0.001, holds=frozenset({"h:1|/dpool_9_1"}))
    assert missing_bytes(fresh, inputs) == 64 * MB and missing_bytes(warm, inputs) == 0
    assert choose([fresh, warm], origin="x", inputs=inputs) is warm
    # ...unless it is so busy that waiting costs more than the transfer (64 ms at 1 GB/s)
    warm.busy, warm.queued, warm.avg_task_s = 2, 10, 0.05
    assert choose([fresh, warm], origin="x", inputs=inputs) is fresh
    holder = NodeLoad("h:1", cpus=2, avg_task_s=0.001)  # the holder needs no transfer
    assert choose([fresh, holder], origin="x", inputs=inputs) is holder


def test_a_request_goes_only_to_a_node_that_has_it_free_ones_first():
    from dpool.scheduling._resources import Request

    gpu = NodeLoad("g:1", cpus=2, busy=2, queued=5, resources={"GPU": 2, "TPU": 1},
                   free={"GPU": 0, "TPU": 1})
    gpu_idle = NodeLoad("g:2", cpus=2, busy=0, resources={"GPU": 1}, free={"GPU": 1})
    cpu = NodeLoad("c:1", cpus=8, resources={"GPU": 0}, free={"GPU": 0})
    nodes = [gpu, gpu_idle, cpu]
    assert choose(nodes, "o:1", req=Request(1, 1.0)) is gpu_idle
    assert choose(nodes, "o:1", req=Request(1, 2.0)) is gpu  # only it can, busy or not
    assert choose(nodes, "o:1", req=Request(1, 0, 0, (("TPU", 1.0),))) is gpu
    assert choose(nodes, "o:1", req=Request(4)) is cpu
    assert choose(nodes, "o:1", req=Request(1, 3.0)) is None
    assert choose(nodes, "o:1", req=Request(1, 0, 0, (("FPGA", 1.0),))) is None
    assert choose(nodes, "o:1") is cpu  # no request: the least wait
