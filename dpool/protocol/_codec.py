"""The one codec: a batch of messages <-> one frame of bytes.

A frame is ``pickle((PROTOCOL_VERSION, ((code, *fields), ...)))``. Only plain tuples, ints,
floats, bools and bytes cross the wire at this layer (payloads are pre-serialized), so the
stdlib C pickler is both the fastest and a safe choice here. An unknown code or version
raises ``ProtocolError`` on the receiving side (never ignored silently).
"""

from __future__ import annotations

import operator
import pickle
import threading

from dpool.errors import ProtocolError
from dpool.protocol import _messages as m

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Callable, Iterable

PROTOCOL_VERSION = 9  # 3: worker leases; 4: SubmitTask and RemoteTask carry a resource request;
# 5: FetchSegment asks for a range; 6: PushSegment (a TCP driver uploads a large value);
# 7: CreateGroup carries an actor's settings; 8: ActorSaved (a placed actor's checkpoint
# goes to its driver's node); 9: limits -- CreateGroup's, a request's timeout,
# ReturnTasks(retire)



def _item_getter(cls: type) -> Callable[[object], tuple]:
    """``msg -> (code, *fields)`` in one C-level attrgetter call (the encode hot path)."""
    code = (cls.CODE,)  # type: ignore[attr-defined]
    fields: tuple[str, ...] = cls.__slots__  # type: ignore[attr-defined]
    if not fields:
        return lambda msg: code
    if len(fields) == 1:
        one = operator.attrgetter(fields[0])
        return lambda msg: (*code, one(msg))
    many = operator.attrgetter(*fields)
    return lambda msg: code + many(msg)


class _Items(dict):
    """message class -> its ``_item_getter``; the cluster's messages are added when one is
    first encoded (``_messages_cluster`` loads on first use)."""

    def __missing__(self, cls: type) -> Callable[[object], tuple]:
        _add_cluster_messages()
        getter = self.get(cls)
        if getter is None:
            raise KeyError(cls)
        return getter  # type: ignore[no-any-return]


_BY_CODE: dict[int, type] = {}
_ITEM = _Items()


def _add(classes: Iterable[type]) -> None:
    for cls in classes:
        code = cls.CODE  # type: ignore[attr-defined]
        if code in _BY_CODE:  # pragma: no cover - guards edits to _messages
            raise RuntimeError(f"duplicate message code {code}")
        _BY_CODE[code] = cls
        _ITEM[cls] = _item_getter(cls)


_adding = threading.Lock()  # (the IO thread may decode the first one as another encodes)


def _add_cluster_messages() -> None:
    """Register the cluster's messages, once."""
    cluster = m.CLUSTER_MESSAGES
    with _adding:
        if cluster[0].CODE not in _BY_CODE:  # type: ignore[attr-defined]
            _add(cluster)


_add(m.EMBEDDED_MESSAGES)

_dumps = pickle.dumps
_loads = pickle.loads


def encode_batch(msgs: Iterable[object]) -> bytes:
    """Encode messages into one frame body."""
    item = _ITEM
    return _dumps((PROTOCOL_VERSION, [item[type(msg)](msg) for msg in msgs]), protocol=5)


def decode_batch(frame: bytes) -> list:
    """Decode one frame body into message objects."""
    try:
        version, items = _loads(frame)
    except Exception as exc:
        raise ProtocolError(f"undecodable frame of {len(frame)} bytes") from exc
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"peer speaks protocol version {version}, this process speaks "
            f"{PROTOCOL_VERSION}: run the same dpool version everywhere"
        )
    out = []
    for item in items:
        cls = _BY_CODE.get(item[0])
        if cls is None:
            _add_cluster_messages()
            cls = _BY_CODE.get(item[0])
            if cls is None:
                raise ProtocolError(f"unknown message code {item[0]!r}")
        out.append(cls(*item[1:]))
    return out
