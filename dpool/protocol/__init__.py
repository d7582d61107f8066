"""The wire protocol between dpool processes, and what every connection starts with.

- ``_messages``: every message, a ``Slotted`` record (a slotted dataclass) with a numeric
  ``CODE``; ``_messages_cluster`` holds the cluster's own (nodes, global schedulers),
  re-exported.
- ``_record``: ``@record``, what ``@dataclass`` makes of a class, compiled on first use.
- ``_codec``: a batch of messages to one frame and back (the only encoder and the only
  dispatch table; ``PROTOCOL_VERSION``).
- ``_channel``: frames over a stream socket, blocking or non-blocking.
- ``_auth``: the token handshake every connection starts with (mutual HMAC).
- ``_dial``: addresses, and dialing another process: connect, handshake, hello.
- ``_ioloop``: one selector thread over many channels (the local scheduler's, which a
  node's links share; the global scheduler's; a driver's leased workers).
- ``_startup``: what a worker process is told when it starts, and its entry module.
- ``_workdir``: the driver's working directory, packed by content hash for the nodes.
"""

from dpool._lazy import front_door
from dpool.protocol._channel import Channel, ChannelClosed
from dpool.protocol._codec import PROTOCOL_VERSION, decode_batch, encode_batch

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from dpool.protocol import _auth as auth
    from dpool.protocol import _dial as dial
    from dpool.protocol import _messages as messages
    from dpool.protocol import _running as running
    from dpool.protocol import _workdir as workdir
    from dpool.protocol._dial import DialError, parse_hostport
    from dpool.protocol._ioloop import SPIN_S, IOLoop
    from dpool.protocol._record import field, record
    from dpool.protocol._startup import WorkerConfig, preload_worker, start_worker
    from dpool.protocol._workdir import map_path

# What other packages use, loaded on first use (PEP 562): importing this package
# loads none of its modules. A name in ``_LAZY`` is its module's; one in ``_MODULES``
# is the module itself, used as a namespace (``from dpool.protocol import messages as m``).
_MODULES = {
    "auth": "dpool.protocol._auth",
    "dial": "dpool.protocol._dial",
    "messages": "dpool.protocol._messages",
    "running": "dpool.protocol._running",
    "workdir": "dpool.protocol._workdir",
}
_LAZY = {
    **dict.fromkeys(("DialError", "parse_hostport"), "dpool.protocol._dial"),
    **dict.fromkeys(("SPIN_S", "IOLoop"), "dpool.protocol._ioloop"),
    **dict.fromkeys(("field", "record"), "dpool.protocol._record"),
    **dict.fromkeys(("WorkerConfig", "preload_worker", "start_worker"), "dpool.protocol._startup"),
    "map_path": "dpool.protocol._workdir",
}

__all__ = [
    "PROTOCOL_VERSION",
    "SPIN_S",
    "Channel",
    "ChannelClosed",
    "DialError",
    "IOLoop",
    "WorkerConfig",
    "auth",
    "decode_batch",
    "dial",
    "encode_batch",
    "field",
    "map_path",
    "messages",
    "parse_hostport",
    "preload_worker",
    "record",
    "running",
    "start_worker",
    "workdir",
]


__getattr__, __dir__ = front_door(__name__, _LAZY, _MODULES)
