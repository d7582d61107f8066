"""A cluster process's outgoing connections: to global schedulers and to other nodes.

``send(address, msgs)`` never blocks on the network: on an established link it writes
through the IO loop's non-blocking channel; otherwise the messages wait in a per-address
queue while a connector thread connects, runs the token handshake, says ``PeerHello``
and reads ``PeerWelcome``, then hands the link to the IO loop (whose handlers receive
what the peer sends back) and writes the queue. A peer that cannot be reached within the
connect timeout gets its queued messages handed to ``on_unreachable`` -- the spillback
takes its tasks back -- and is tried afresh by the next ``send``.

Lock rule: ``self._lock`` guards the link table only; it is never held while calling
out, so ``send`` may be called with the scheduler's lock held.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Optional

from dpool.errors import Error
from dpool.node._attach import PeerHandle
from dpool.protocol import PROTOCOL_VERSION, Channel, ChannelClosed, IOLoop, encode_batch
from dpool.protocol import dial as _dial
from dpool.protocol import messages as m

log = logging.getLogger("dpool.node")

CONNECT_TIMEOUT = 5.0


def dial(address: str, token: bytes, hello: m.PeerHello,
         timeout: float = CONNECT_TIMEOUT) -> tuple[Channel, m.PeerWelcome]:
    """Connect to a cluster process as a peer (blocking); a clear ``dpool.Error``."""
    host, port = _dial.parse_hostport(address, "peer address")
    try:
        sock = _dial.connect(host, port, token, address, timeout)
        return _dial.greet(sock, hello, m.PeerWelcome, timeout)
    except _dial.Unreachable as exc:
        raise Error(f"cannot reach {address}: {exc}") from exc.cause
    except _dial.Broken as exc:
        raise Error(f"connection to {address} failed: {exc}") from exc.cause
    except _dial.NotAnswered:
        raise Error(f"{address} did not welcome this peer within {timeout:g} s") from None


class Links:
    def __init__(self, token: bytes, hello: m.PeerHello, io: IOLoop,
                 on_unreachable: Callable[[str, list], None]) -> None:
        self._token = token
        self._hello = hello
        self._io = io
        self._on_unreachable = on_unreachable
        self._lock = threading.Lock()
        self._links: dict[str, PeerHandle] = {}
        self._waiting: dict[str, list] = {}  # address -> messages queued while connecting
        self.welcome: dict[str, dict] = {}  # address -> the peer's PeerWelcome info

    def connected(self, address: str) -> bool:
        h = self._links.get(address)
        return h is not None and h.alive

    def addresses(self) -> list[str]:
        return [a for a, h in list(self._links.items()) if h.alive]

    def tasks_in(self) -> dict[str, int]:
        """Per linked address, the spilled tasks received over its link so far."""
        return {a: h.tasks_in for a, h in list(self._links.items()) if h.alive}

    def send(self, address: str, msgs: list) -> None:
        with self._lock:
            h = self._links.get(address)
            if h is None or not h.alive:
                waiting = self._waiting.get(address)
                if waiting is not None:
                    waiting.extend(msgs)
                    return
                self._waiting[address] = list(msgs)
                threading.Thread(target=self._connect, args=(address,), daemon=True,
                                 name="dpool-link-connect").start()
                return
        self._write(h, msgs)

    def connect_soon(self, address: str) -> None:
        """Open a link now (to a global scheduler: it sends tasks back over it)."""
        self.send(address, [])

    def _write(self, h: PeerHandle, msgs: list) -> None:
        if not msgs:
            return
        try:
            if not h.chan.send(encode_batch(msgs)):
                self._io.want_write(h)
        except ChannelClosed:
            pass  # the IO loop sees the close and calls the peer-closed hooks

    def _connect(self, address: str) -> None:
        try:
            chan, welcome = dial(address, self._token, self._hello)
        except Error as exc:
            log.warning("dpool: %s", exc)
            with self._lock:
                msgs = self._waiting.pop(address, [])
            if msgs:
                self._on_unreachable(address, msgs)
            return
        h = PeerHandle(chan, welcome.peer_id, address, outgoing=True)
        chan.set_blocking(False)
        self._io.add(h)  # before any write that may need the loop's write interest
        with self._lock:
            try:
                self.welcome[address] = json.loads(welcome.info or "{}")
            except ValueError:
                self.welcome[address] = {}
            msgs = self._waiting.pop(address, [])
            if h.alive:
                # the queued messages go first, then the link is published: nothing
                # sent meanwhile can overtake them
                self._write(h, msgs)
                self._links[address] = h
                msgs = []
        if msgs:
            # The IO loop saw the link close before it was published (its closed hooks
            # ran already, and ``forget`` found nothing to forget): written to it, these
            # would be lost without a trace. The spillback takes their tasks back.
            log.warning("dpool: the link to %s closed as it opened", address)
            self._on_unreachable(address, msgs)
            return
        log.info("linked to %s (%s)", welcome.peer_id, address)

    def forget(self, h: PeerHandle) -> None:
        """A link closed: the next ``send`` to its address connects again."""
        with self._lock:
            if self._links.get(h.address) is h:
                del self._links[h.address]

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` until what was sent is written out and no link is still
        connecting with messages waiting (before ``close``: a stopping node's last
        words). Whether it all went."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                busy = bool(self._waiting) or any(h.chan.pending_output()
                                                  for h in self._links.values())
            if not busy:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        with self._lock:
            links = list(self._links.values())
            self._links.clear()
        for h in links:
            h.mark_stopping()
            h.chan.close()


def welcome_message(peer_id: str, info: Optional[dict] = None) -> bytes:
    return encode_batch([m.PeerWelcome(peer_id, json.dumps(info or {}))])


def peer_hello(node_id: str, address: str, num_cpus: int) -> m.PeerHello:
    return m.PeerHello(PROTOCOL_VERSION, node_id, address, num_cpus)
