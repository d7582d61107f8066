"""The wire protocol between dpool processes: typed messages, one codec, framing.

``messages`` defines every message as a slotted dataclass with a numeric ``CODE``;
``codec`` turns a batch of messages into one frame and back (the only encoder and the only
dispatch table); ``channel`` moves frames over a stream socket.
"""

from dpool.protocol._channel import Channel, ChannelClosed
from dpool.protocol._codec import PROTOCOL_VERSION, decode_batch, encode_batch

__all__ = ["PROTOCOL_VERSION", "encode_batch", "decode_batch", "Channel", "ChannelClosed"]
