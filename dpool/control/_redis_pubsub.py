"""Pub/sub of the Redis control store (``RedisControlStore.subscribe``): one listener
thread per shard a channel lives on, each waiting for notices without a pace."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from dpool.control import _keys as K

log = logging.getLogger("dpool.control")

_LISTEN_S = 5.0  # the longest wait of a pub/sub listener (it is woken to stop)

Callback = Callable[[str, bytes], None]


class _Listener(threading.Thread):
    """A pub/sub listener thread that waits for notices without polling (redis-py's own,
    ``run_in_thread``, polls to see whether it was stopped, which an idle node daemon
    must not pay: bench/IDLE.md). ``stop`` wakes it with a notice on
    a channel of its own (``_keys.wake_channel``); the wait's timeout is a safety net for
    a shard that cannot take that notice."""

    def __init__(self, client: Any, pubsub: Any, wake: str,
                 on_error: Callable[[BaseException, Any, Any], None]) -> None:
        super().__init__(daemon=True)
        self._client = client
        self._pubsub = pubsub
        self._wake = wake
        self._on_error = on_error
        self._running = True

    def run(self) -> None:
        ps = self._pubsub
        while self._running:
            try:
                ps.get_message(ignore_subscribe_messages=True, timeout=_LISTEN_S)
            except BaseException as e:  # noqa: BLE001 - as run_in_thread: report, go on
                if not self._running:
                    break
                self._on_error(e, ps, self)
        ps.close()

    def stop(self) -> None:
        self._running = False
        try:
            self._client.publish(self._wake, b"")
        except redis.RedisError:
            pass  # the shard is away: the wait's timeout ends the thread


def _ignore(message: dict) -> None:
    pass


class Subscription:
    """A running pub/sub listener (one thread per shard involved); ``stop()`` ends it."""

    def __init__(self, threads: list) -> None:
        self._threads = threads

    def stop(self, timeout: float = 2.0) -> None:
        for t in self._threads:
            t.stop()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
        self._threads = []


class PubSub:
    """``subscribe`` for ``RedisControlStore`` (its ``_clients``, ``_n``, ``_errors`` and
    ``_subscriptions``)."""

    _clients: list
    _n: int
    _subscriptions: list
    _errors: Callable[[int, str], Any]

    def subscribe(self, channels: Iterable[str], callback: Callback) -> Subscription:
        """Call ``callback(channel, data)`` from a listener thread for every notice on
        ``channels`` (``_keys.CHANNELS``); decode ``data`` with
        ``_keys.parse_object_ready`` / ``parse_node_dead`` / ``parse_scheduler_up``.
        Returns a handle whose ``stop()`` ends the listener (``close`` stops them all).

        Pub/sub keeps nothing: notices published while a listener is reconnecting to a
        restarted shard are lost, so a consumer that must not miss a death also polls
        ``nodes()``."""
        per_shard: dict[int, list[str]] = {}
        for ch in channels:
            for shard in K.channel_shards(ch, self._n):
                per_shard.setdefault(shard, []).append(ch)

        def handler(message: dict) -> None:
            try:
                callback(message["channel"].decode(), message["data"])
            except Exception:
                log.exception("control-store subscriber callback failed")

        def on_error(e: BaseException, pubsub: Any, thread: Any) -> None:
            log.warning("control-store pub/sub listener: %s; retrying", e)
            time.sleep(0.5)

        threads = []
        try:
            for shard, chans in per_shard.items():
                client = self._clients[shard]
                ps = client.pubsub(ignore_subscribe_messages=True)
                wake = K.wake_channel(os.urandom(8).hex())
                try:
                    with self._errors(shard, "SUBSCRIBE"):
                        ps.subscribe(**{ch: handler for ch in chans}, **{wake: _ignore})
                except BaseException:
                    ps.close()
                    raise
                thread = _Listener(client, ps, wake, on_error)
                thread.name = f"dpool-control-pubsub-{shard}"
                thread.start()
                threads.append(thread)
        except BaseException:
            Subscription(threads).stop()
            raise
        sub = Subscription(threads)
        self._subscriptions.append(sub)
        return sub
