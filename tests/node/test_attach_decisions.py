"""What the node decides for attached drivers (``node._attach``), without sockets.

``DriverSessions`` over a fake scheduler (``_fake_scheduler``), with driver handles on
fake channels: which stored values a TCP driver may name (only those it pushed), which
queued tasks a cancel drops, where a worker's output goes, how a group's paths map onto
the node's copy of the driver's code, and what a value sent to a driver looks like.
"""

from __future__ import annotations

import socket
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from dpool.errors import ObjectStoreFullError, ProtocolError
from dpool.node._attach import DriverHandle, DriverSessions, PeerHandle
from dpool.objects import _segment, _values
from dpool.protocol import _messages as m
from dpool.scheduling import Task, WorkerHandle
from dpool.transfer import _pull
from tests.node._fake_scheduler import FakeScheduler

NODE = "node-a:6000"


def _driver(sessions: DriverSessions, sid: int, local: bool, prefix: int) -> DriverHandle:
    family = socket.AF_UNIX if local else socket.AF_INET
    chan = SimpleNamespace(sock=SimpleNamespace(family=family))
    d = DriverHandle(sid, chan,
                     m.Attach(0, 1000 + sid, "host", "/home/u/proj", ("/home/u/proj",)))
    d.prefix = prefix
    sessions.drivers[sid] = d
    if not local:  # as ``attach`` does for a driver over TCP
        sessions._pushers.add(prefix)
    return d


def _stored(oid: int, size: int, owner_pid: int) -> tuple[bytes, str]:
    """A stored value's payload (a reference to its segment) and the segment's name."""
    name = _segment.segment_name(owner_pid, oid)
    return _values._STORED_HEAD.pack(_values.TAG_STORED, oid, size) + name.encode(), name


@pytest.fixture
def node() -> tuple[FakeScheduler, DriverSessions]:
    s = FakeScheduler()
    return s, DriverSessions(s, NODE, num_cpus=4)


def test_the_sessions_plug_in_through_the_api(node) -> None:
    s, sessions = node
    assert s.sessions is sessions and s.leases is sessions.leases
    assert s.handlers[m.CreateGroup.CODE] == sessions._on_create_group_locked
    assert s.handlers[m.SubmitTask.CODE] == sessions._on_submit_locked
    assert s.handlers[m.LeasedResult.CODE] == sessions.leases._on_leased_result_locked


# -- values a driver over TCP pushed: it may name those, and only those -------------------
def test_a_tcp_driver_names_the_value_it_pushed_once(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=False, prefix=5)
    g = s.new_group(group_id=3)
    payload, name = _stored((5 << 40) | 1, 1 << 20, s.store.owner_pid)
    sessions._may_push((5 << 40) | 1, 1 << 20)
    assert sessions._keep_pushed(name, 1 << 20)
    sessions._on_submit_locked(d, m.SubmitTask(9, 7, payload, None, g.group_id))
    assert [msg.args for msg in s.submitted] == [payload]  # adopted with the task, as is
    with pytest.raises(ProtocolError, match="did not upload"):  # claimed already
        sessions._on_submit_locked(d, m.SubmitTask(10, 7, payload, None, g.group_id))


def test_a_tcp_driver_cannot_name_another_drivers_upload(node) -> None:
    s, sessions = node
    mine = _driver(sessions, 1, local=False, prefix=5)
    _driver(sessions, 2, local=False, prefix=6)
    theirs, name = _stored((6 << 40) | 1, 100, s.store.owner_pid)
    assert sessions._keep_pushed(name, 100)
    with pytest.raises(ProtocolError):
        sessions._on_put_locked(mine, m.PutObject((5 << 40) | 2, theirs))
    assert name in sessions._pushed and not s.put  # still the other driver's


def test_a_tcp_driver_cannot_name_any_other_segment(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=False, prefix=5)
    payload, _ = _stored((5 << 40) | 3, 100, s.store.owner_pid + 1)  # another store's
    with pytest.raises(ProtocolError):
        sessions._on_put_locked(d, m.PutObject((5 << 40) | 3, payload))


def test_a_pushed_value_whose_size_is_misstated_is_refused(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=False, prefix=5)
    payload, name = _stored((5 << 40) | 1, 999, s.store.owner_pid)
    assert sessions._keep_pushed(name, 100)  # 100 bytes arrived
    with pytest.raises(ProtocolError):
        sessions._on_put_locked(d, m.PutObject((5 << 40) | 1, payload))
    assert name not in sessions._pushed  # not kept for anyone


def test_a_value_pushed_for_a_group_that_is_gone_is_removed(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=False, prefix=5)
    payload, name = _stored((5 << 40) | 1, 100, s.store.owner_pid)
    assert sessions._keep_pushed(name, 100)
    sessions._on_submit_locked(d, m.SubmitTask(9, 7, payload, None, group_id=77))
    assert s.store.unlinked == [name]  # no task will adopt it


def test_only_attached_tcp_drivers_may_push_and_within_the_store(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=False, prefix=5)
    sessions._may_push((5 << 40) | 1, 100)
    with pytest.raises(ProtocolError):
        sessions._may_push((6 << 40) | 1, 100)  # nobody's prefix
    with pytest.raises(ObjectStoreFullError, match="larger than the object store"):
        sessions._may_push((5 << 40) | 2, s.store.capacity + 1)
    # it detaches: its uploads never named are removed, and it may push no more
    _, name = _stored((5 << 40) | 4, 100, s.store.owner_pid)
    assert sessions._keep_pushed(name, 100)
    sessions.handle_closed_locked(d)
    assert s.store.unlinked == [name] and s.dropped_handles == [d]
    with pytest.raises(ProtocolError):
        sessions._may_push((5 << 40) | 5, 100)
    assert not sessions._keep_pushed(_stored((5 << 40) | 6, 1, s.store.owner_pid)[1], 1)


# -- groups and cancels -------------------------------------------------------------------
def test_cancel_queued_drops_the_unstarted_tasks_of_the_drivers_group_only(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=True, prefix=5)
    other = _driver(sessions, 2, local=True, prefix=6)
    sessions._on_create_group_locked(d, m.CreateGroup(3, 2, "", None, None, 3, ()))
    sessions._on_create_group_locked(other, m.CreateGroup(4, 2, "", None, None, 3, ()))
    g, g_other = s.groups[3], s.groups[4]
    tasks = [Task(i, 7, None, None, g, d, None) for i in range(4)]
    tasks[1].started = True  # (a task given back by a blocked worker: it ran already)
    g.queue.extend(tasks)
    g_other.queue.append(Task(9, 7, None, None, g_other, other, None))
    sessions._on_group_op_locked(d, m.GroupOp(3, "cancel_queued", ""))
    assert [t.task_id for t in g.queue] == [1]
    assert sorted(t.task_id for t, ok, _ in s.finished if not ok) == [0, 2, 3]
    assert all(t.owner is None for t, _, _ in s.finished)  # no value sent: cancelled there
    ((to, msgs),) = s.sent
    assert to is d and msgs == [m.CancelTask((0, 2, 3)), m.GroupOp(3, "cancelled", "")]
    # another driver's group is none of its business: as if it did not exist
    s.sent.clear()
    sessions._on_group_op_locked(d, m.GroupOp(4, "cancel_queued", ""))
    assert len(g_other.queue) == 1 and s.sent == [(d, [m.GroupOp(4, "cancelled", "")])]


def test_closing_a_group_it_does_not_have_answers_at_once(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=True, prefix=5)
    sessions._on_group_op_locked(d, m.GroupOp(8, "close_notify", ""))
    assert s.sent == [(d, [m.GroupExited(8)])]
    sessions._on_group_op_locked(d, m.GroupOp(8, "close", ""))
    assert not s.closed_groups


def test_an_unknown_group_operation_is_an_error(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=True, prefix=5)
    sessions._on_create_group_locked(d, m.CreateGroup(3, 2, "", None, None, 3, ()))
    with pytest.raises(ValueError, match="unknown group operation"):
        sessions._on_group_op_locked(d, m.GroupOp(3, "explode", ""))


def test_a_group_runs_in_the_nodes_copy_of_the_drivers_code(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=False, prefix=5)
    d.cwd, d.sys_path = "/home/u/proj/sub", ["/home/u/proj", "/usr/lib/python3"]
    d.workdirs["abc"] = "/var/dpool/workdirs/abc"  # unpacked here (``WorkingDir``)
    sessions._on_create_group_locked(
        d, m.CreateGroup(3, 2, "", None, None, 3, ("abc", "/home/u/proj")))
    g = s.groups[3]
    assert g.owner is d and 3 in d.groups
    assert g.cwd == "/var/dpool/workdirs/abc/sub"
    assert g.sys_path == ["/var/dpool/workdirs/abc", "/var/dpool/workdirs/abc",
                          "/usr/lib/python3"]
    assert g.workdir == ("abc", "/var/dpool/workdirs/abc")


# -- output and values ---------------------------------------------------------------------
def test_output_goes_to_the_driver_or_back_to_the_origin_node(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=True, prefix=5)
    sessions._on_create_group_locked(d, m.CreateGroup(3, 2, "", None, None, 3, ()))
    mirror = s.new_group(group_id=40)  # runs tasks node-b spilled here
    to_nodes: list = []
    sessions.remote_origin = lambda g: ("node-b:6000", 12) if g is mirror else None
    sessions.send_to_node = lambda address, msgs: to_nodes.append((address, msgs))
    worker = WorkerHandle(1, s.groups[3], None, None)
    sessions.forward_output_locked(worker, m.Output(0, 77, "", "stdout", b"hi\n"))
    assert s.sent == [(d, [m.Output(3, 77, "", "stdout", b"hi\n")])]
    away = WorkerHandle(2, mirror, None, None)
    sessions.forward_output_locked(away, m.Output(0, 78, "", "stderr", b"x"))
    assert to_nodes == [("node-b:6000", [m.Output(12, 78, NODE, "stderr", b"x")])]
    # from a peer: to the driver whose group it names
    s.sent.clear()
    peer = PeerHandle(SimpleNamespace(), "node-b", "node-b:6000", outgoing=False)
    sessions.forward_output_locked(peer, m.Output(3, 78, "node-b", "stderr", b"y"))
    assert s.sent == [(d, [m.Output(3, 78, "node-b", "stderr", b"y")])]


def test_a_stored_value_goes_to_a_tcp_driver_by_reference(node) -> None:
    s, sessions = node
    local = _driver(sessions, 1, local=True, prefix=5)
    remote = _driver(sessions, 2, local=False, prefix=6)
    payload, name = _stored(11, 1 << 20, s.store.owner_pid)
    assert sessions.value_message(local, 11, True, payload) == \
        m.ObjectValue(11, True, payload)  # maps the segment itself
    ref = sessions.value_message(remote, 11, True, payload).payload
    assert _pull.parse_remote(ref) == (1 << 20, NODE, name)  # pulls it off this node
    small = b"\x80small"
    assert sessions.value_message(remote, 12, True, small).payload == small
    assert sessions.value_message(remote, 13, False, b"err").payload == b"err"


def test_only_live_drivers_of_this_host_map_the_store(node) -> None:
    s, sessions = node
    here = _driver(sessions, 1, local=True, prefix=5)
    gone = _driver(sessions, 2, local=True, prefix=6)
    _driver(sessions, 3, local=False, prefix=7)
    gone.mark_closed()
    assert list(sessions.local_drivers_locked()) == [here]


def test_a_driver_that_detaches_breaks_its_groups(node) -> None:
    s, sessions = node
    d = _driver(sessions, 1, local=True, prefix=5)
    sessions._on_create_group_locked(d, m.CreateGroup(3, 2, "", None, None, 3, ()))
    t = Task(1, 7, None, None, s.groups[3], None, Future())
    s.groups[3].queue.append(t)
    sessions.handle_closed_locked(d)
    g = s.groups[3]
    assert g.closed and g.broken and "disconnected" in g.broken
    assert s.failed_groups == [(g, g.broken)] and s.dropped_handles == [d]
    assert 1 not in sessions.drivers and not d.alive
