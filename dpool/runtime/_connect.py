"""A cluster driver's connection to its node: dial (unix socket or TCP), authenticate
with the cluster's token and attach (``Attach`` -> ``Attached``), with a clear
``dpool.Error`` for each way it can fail (``_cluster``; a TCP driver's move, ``_move``)."""

from __future__ import annotations

import os
import socket
import sys

from dpool.errors import Error
from dpool.protocol import PROTOCOL_VERSION, Channel
from dpool.protocol import dial as _dial
from dpool.protocol import messages as m
from dpool.runtime._address import Target

CONNECT_TIMEOUT = 10.0


def connect(target: Target, timeout: float = CONNECT_TIMEOUT) -> tuple[Channel, m.Attached]:
    """Connect, authenticate and attach; a clear ``dpool.Error`` within ``timeout``."""
    where = f"the dpool node at {target.address}"
    hello = m.Attach(PROTOCOL_VERSION, os.getpid(), socket.gethostname(), os.getcwd(),
                     tuple(sys.path))
    try:
        if target.unix_path:
            sock = _dial.connect_unix(target.unix_path, target.token, where, timeout)
        else:
            sock = _dial.connect(target.host, target.port, target.token, where, timeout)
        return _dial.greet(sock, hello, m.Attached, timeout)
    except _dial.Unreachable as exc:
        cause = exc.cause
        if isinstance(cause, socket.timeout):
            raise Error(f"cannot reach {where}: no answer within {timeout:g} s "
                        "(check DPOOL_ADDRESS and that `dpool start` runs there)") from cause
        raise Error(f"cannot reach {where}: {cause.strerror or cause} (check DPOOL_ADDRESS "
                    "and that `dpool start` runs there)") from cause
    except _dial.Broken as exc:  # reset, refused mid-way, timed out
        raise Error(f"{where} closed the connection while attaching: {exc}") from exc.cause
    except _dial.NotAnswered:
        raise Error(f"{where} did not accept this driver within {timeout:g} s") from None
