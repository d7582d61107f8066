"""Control store records lineage and events; the codec refuses what it does not know."""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from dpool import ProcessPoolExecutor
from dpool.control import InProcessControlStore
from dpool.errors import ProtocolError
from dpool.protocol import PROTOCOL_VERSION, Channel, decode_batch, encode_batch
from dpool.protocol import _messages as m


def inc(x):
    return x + 1


def test_codec_round_trip_every_message_type():
    msgs = [m.Hello(PROTOCOL_VERSION, 3, 1234), m.ExecuteTask(7, 2, b"args", None),
            m.TaskDone(7, True, b"\x80\x05K\x01.", 0.5), m.Blocked((1, 2)), m.Unblocked(),
            m.ObjectValue(9, False, b"err"), m.Release((1,)), m.Shutdown(),
            m.PutObject(4, b"x"), m.SubmitTask(8, 2, None, (7,), 1)]
    assert decode_batch(encode_batch(msgs)) == msgs


def test_the_cluster_messages_load_when_first_met():
    """A fresh process on the embedded runtime has not loaded the cluster's messages;
    decoding one (a peer sent it) or encoding one (``m.FetchSegment`` used) loads them."""
    code = textwrap.dedent("""
        import pickle, sys
        from dpool.protocol import PROTOCOL_VERSION, decode_batch, encode_batch
        from dpool.protocol import _messages as m
        assert "dpool.protocol._messages_cluster" not in sys.modules
        decode_batch(encode_batch([m.Hello(PROTOCOL_VERSION, 1, 2)]))
        assert "dpool.protocol._messages_cluster" not in sys.modules
        fields = (7, "/seg", 0, -1)
        if sys.argv[1] == "encode":
            (msg,) = decode_batch(encode_batch([m.FetchSegment(*fields)]))
        else:  # a peer's frame: the message's code (given) and its fields
            frame = pickle.dumps((PROTOCOL_VERSION, [(int(sys.argv[2]),) + fields]))
            (msg,) = decode_batch(frame)
        assert msg == m.FetchSegment(*fields), msg
        assert len(m.ALL_MESSAGES) == len(m.EMBEDDED_MESSAGES) + len(m.CLUSTER_MESSAGES)
        print("ok")
    """)
    for how in ("decode", "encode"):
        out = subprocess.run([sys.executable, "-c", code, how, str(m.FetchSegment.CODE)],
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "ok", out.stderr


def test_codec_rejects_unknown_code_and_version():
    with pytest.raises(ProtocolError, match="unknown message code"):
        decode_batch(pickle.dumps((PROTOCOL_VERSION, [(999,)])))
    with pytest.raises(ProtocolError, match="version"):
        decode_batch(pickle.dumps((PROTOCOL_VERSION + 1, [])))
    with pytest.raises(ProtocolError):
        decode_batch(b"garbage")


def test_channel_reassembles_frames_split_across_reads():
    a, b = socket.socketpair()
    tx, rx = Channel(a), Channel(b)
    big = b"y" * 300_000  # larger than the socket buffer: arrives in several reads
    sender = threading.Thread(target=lambda: (tx.send(b"first"), tx.send(big)))
    sender.start()
    frames = []
    while len(frames) < 2:
        frames += rx.recv_frames(timeout=5)
    assert frames == [b"first", big]
    sender.join(5)
    assert rx.recv_frames(timeout=0.05) == []
    tx.close(), rx.close()


def test_the_read_buffer_starts_small_and_grows_while_reads_fill_it():
    """A quiet channel holds 16 KiB to read into; one whose reads fill it reads twice as
    much next time, up to 256 KiB. Frames of every size come through whole meanwhile."""
    from dpool.protocol import _channel

    a, b = socket.socketpair()
    tx, rx = Channel(a), Channel(b)
    assert len(rx._chunk) == _channel._FIRST_CHUNK == 16384
    tx.send(b"x" * (100_000 - 8))  # one 100 kB frame, all queued in the socket already
    assert rx.recv_frames(timeout=5) == [b"x" * (100_000 - 8)]
    # reads of 16 KiB and 32 KiB filled the buffer (each doubled it), the rest did not
    assert len(rx._chunk) == 65536
    small = [bytes([i]) * i for i in range(1, 200)]
    big = bytes(range(256)) * 4096  # 1 MiB: more than the socket holds
    sender = threading.Thread(target=lambda: [tx.send(x) for x in (*small, big, *small)])
    sender.start()
    frames = []
    while len(frames) < 2 * len(small) + 1:
        frames += rx.recv_frames(timeout=5)
    sender.join(5)
    assert frames == [*small, big, *small]
    assert len(rx._chunk) <= _channel._RECV_CHUNK
    tx.close(), rx.close()


def test_lineage_and_events_are_recorded():
    with ProcessPoolExecutor(1) as ex:
        f = ex.submit(inc, 1)
        g = ex.submit(inc, f)
        assert g.result(30) == 3
        ctl = ex._runtime.control
        rec = ctl.get_task(g._oid)
        assert rec is not None and rec.dep_ids == (f._oid,) and rec.state == "FINISHED"
        assert rec.attempts == 1 and ctl.get_function(rec.fn_id) is not None
        kinds = [k for tid, k, _t, _w in ctl.events() if tid == g._oid]
        assert kinds == ["submit", "start", "end"]


def test_in_process_store_batches_writes_until_flush():
    ctl = InProcessControlStore()
    ctl.add_task(1, 2, None, (), 0)
    assert ctl.backlog() == 1
    assert ctl.get_task(1).fn_id == 2  # reads flush first
    ctl.remove_object(1)
    assert ctl.get_task(1) is None  # lineage dropped with its object
