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

from dpool.protocol._channel import Channel, ChannelClosed
from dpool.protocol._codec import PROTOCOL_VERSION, decode_batch, encode_batch

__all__ = ["PROTOCOL_VERSION", "encode_batch", "decode_batch", "Channel", "ChannelClosed"]
