"""Forming a collective group: the rendezvous, then a TCP link between every two members.

Rank 0 coordinates. It listens, and its address reaches the others either through the
runtime's key-value table (``init_group`` in each member: rank 0 puts
``collective:<name>``, the others read it) or from the driver (``create_group``: the
driver asks rank 0's actor to ``open_group``, then every actor to ``join_group`` with its
address). Each other member listens too, connects to rank 0 and says who it is (its
rank, its address, its process and node); once all have, rank 0 sends everyone the
table. Then member ``i`` connects to every member ``j > i`` (a hello names it), and
accepts from those below. Listeners close once the links are up, so a stale address in
the table (a group formed again) is refused and read again. Nothing here is on the data
path: the control store (or the embedded runtime's table) only carries rank 0's address.
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import time
from typing import Any, Optional

from dpool.collective._wire import HELLO, Link, Recv, Send, transfer
from dpool.errors import CollectiveError

KV_PREFIX = "collective:"


def node_here() -> str:
    return os.environ.get("DPOOL_NODE_ID") or "local"


def _host_ip() -> str:
    node = os.environ.get("DPOOL_NODE_ID", "")
    host = node.rpartition(":")[0] if ":" in node else ""
    return host or "127.0.0.1"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def listen(world: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((_host_ip(), 0))
    sock.listen(max(8, world))
    return sock


class Pending:
    """A member between ``open`` and the end of the rendezvous."""

    def __init__(self, name: str, world: int, rank: int, token: str = "",
                 transport: str = "auto") -> None:
        self.name = name
        self.world = world
        self.rank = rank
        self.token = token or secrets.token_hex(6)
        self.listener = listen(world)
        host, port = self.listener.getsockname()[:2]
        self.info = {"rank": rank, "host": host, "port": port, "pid": os.getpid(),
                     "node": node_here(), "boot": _boot_id()}
        if rank == 0:  # (rank 0's choice is the group's)
            if transport == "auto":
                transport = os.environ.get("DPOOL_COLLECTIVE_TRANSPORT", "auto")
            self.info["transport"] = transport

    @property
    def address(self) -> tuple:
        return (self.info["host"], self.info["port"], self.token)

    def close(self) -> None:
        try:
            self.listener.close()
        except OSError:
            pass


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=2.0)
            sock.settimeout(None)
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _accept(p: Pending, deadline: float) -> socket.socket:
    while True:
        p.listener.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
        try:
            sock, _ = p.listener.accept()
            sock.settimeout(None)
            return sock
        except TimeoutError:
            if time.monotonic() > deadline:
                raise CollectiveError(
                    f"collective group {p.name!r}: rank {p.rank} waited for the other "
                    f"members past the rendezvous timeout ({p.world} expected)",
                    group=p.name) from None


def _hello(link: Link, what: Any, group: str, deadline: float) -> None:
    transfer(group, [Send(link, HELLO, 0, pickle.dumps(what))], deadline)


def _read_hello(link: Link, group: str, deadline: float) -> Any:
    r = Recv(link, HELLO, 0)
    transfer(group, [r], deadline)
    return pickle.loads(r.payload())  # noqa: S301 - from a member of this runtime


def rendezvous(p: Pending, root: Optional[tuple], timeout: float,
               publish: Any = None, lookup: Any = None) -> tuple[list, dict]:
    """The table of every member's info (by rank) and this member's links (by rank).
    ``root``: rank 0's ``address`` (from the driver); else ``publish(address)`` (rank 0)
    and ``lookup()`` (the others: rank 0's address, or None yet) reach it."""
    deadline = time.monotonic() + timeout
    name, world, rank = p.name, p.world, p.rank
    links: dict[int, Link] = {}
    try:
        if rank == 0:
            if publish is not None:
                publish(p.address)
            table: list = [None] * world
            table[0] = p.info
            pending: list[Link] = []
            while len(pending) < world - 1:
                link, hello = _next_hello(p, deadline)
                r = hello.get("rank", -1)
                if hello.get("token") != p.token or hello.get("world") != world or \
                        not 0 < r < world or table[r] is not None:
                    _hello(link, {"refused": _refusal(hello, p, table)}, name, deadline)
                    link.close()
                    if hello.get("token") == p.token:  # (a member of this group: fatal)
                        raise CollectiveError(_refusal(hello, p, table), group=name)
                    continue
                link.rank = r
                table[r] = hello["info"]
                links[r] = link
                pending.append(link)
            for link in pending:
                _hello(link, {"table": table}, name, deadline)
        else:
            table = _join_root(p, root, lookup, links, deadline)
        for j in range(rank + 1, world):  # then the links between the others
            if j in links:
                continue
            info = table[j]
            link = Link(_connect(info["host"], info["port"], deadline), j)
            links[j] = link
            _hello(link, {"rank": rank, "token": p.token}, name, deadline)
        while len(links) < world - 1:
            link, hello = _next_hello(p, deadline)
            r = hello.get("rank", -1)
            if hello.get("token") != p.token or not 0 < r < rank or r in links:
                link.close()
                continue
            link.rank = r
            links[r] = link
        return table, links
    except BaseException:
        for link in links.values():
            link.close()
        raise
    finally:
        p.close()


def _next_hello(p: Pending, deadline: float) -> tuple[Link, dict]:
    """The next connection to this member's listener that says hello (a dict), and its
    hello; a stray or stale one -- silent for 5 s, or saying something else -- is
    dropped."""
    while True:
        link = Link(_accept(p, deadline), -1)
        try:
            hello = _read_hello(link, p.name, min(deadline, time.monotonic() + 5.0))
        except Exception:  # noqa: BLE001 - not a member: a stray or stale one
            hello = None
        if isinstance(hello, dict):
            return link, hello
        link.close()


def _refusal(hello: Any, p: Pending, table: list) -> str:
    r = hello.get("rank", -1) if isinstance(hello, dict) else -1
    if isinstance(hello, dict) and hello.get("world") != p.world:
        return (f"collective group {p.name!r}: rank {r} joined with world_size "
                f"{hello.get('world')}, rank 0 with {p.world}")
    if not 0 < r < p.world:
        return f"collective group {p.name!r}: rank {r} is out of range 0..{p.world - 1}"
    if 0 <= r < len(table) and table[r] is not None:
        return f"collective group {p.name!r}: two members joined as rank {r}"
    return f"collective group {p.name!r}: a stale join (another formation of the group)"


def _join_root(p: Pending, root: Optional[tuple], lookup: Any, links: dict,
               deadline: float) -> list:
    """A member other than rank 0: connect to rank 0 (its address from ``root`` or, a
    stale one refused, from ``lookup`` again), say who it is, get the table."""
    name = p.name
    while True:
        addr = root if root is not None else lookup()
        if addr is None:
            if time.monotonic() > deadline:
                raise CollectiveError(f"collective group {name!r}: rank {p.rank} waited "
                                      "for rank 0 past the rendezvous timeout", group=name)
            time.sleep(0.02)
            continue
        host, port, token = addr
        try:
            link = Link(_connect(host, port, min(deadline, time.monotonic() + 2.0)), 0)
        except OSError:
            if time.monotonic() > deadline:
                raise CollectiveError(f"collective group {name!r}: rank 0 at {host}:{port} "
                                      "cannot be reached", group=name) from None
            time.sleep(0.02)
            continue
        p.token = token
        try:
            _hello(link, {"rank": p.rank, "world": p.world, "token": token,
                          "info": p.info}, name, deadline)
            answer = _read_hello(link, name, deadline)
        except CollectiveError:
            link.close()  # (rank 0 went away: a stale address)
            if root is not None or time.monotonic() > deadline:
                raise
            continue
        if "refused" in answer:
            link.close()
            raise CollectiveError(answer["refused"], group=name)
        links[0] = link
        return answer["table"]
