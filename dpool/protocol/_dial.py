"""Reaching another dpool process over TCP: addresses, and dialing with the handshake."""

from __future__ import annotations

import re

from dpool.errors import Error

_HOSTPORT = re.compile(r"^\[?([A-Za-z0-9._:-]+?)\]?:([0-9]{1,5})$")


def parse_hostport(text: str, what: str = "DPOOL_ADDRESS") -> tuple[str, int]:
    """``"host:port"`` -> (host, port), or a clear ``dpool.Error``."""
    match = _HOSTPORT.match(text.strip())
    if match is None:
        raise Error(f"{what}={text!r} is not HOST:PORT (e.g. 127.0.0.1:6380), nor 'auto'")
    host, port = match.group(1), int(match.group(2))
    if not 0 < port < 65536:
        raise Error(f"{what}={text!r}: port {port} is out of range")
    return host, port
