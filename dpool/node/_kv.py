"""A node's small key-value table: the cluster's, in the control store.

``KVPut``/``KVGet`` from the node's workers and drivers (the rendezvous of collective
groups, ``dpool.collective``) go to the control store on a thread of their own (the IO
thread never waits on Redis), which takes the scheduler's lock to answer with
``ObjectValue``. The embedded runtime answers them from a dict instead
(``LocalScheduler``); this service replaces those handlers on a node.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from dpool.control import ClusterControlStore
from dpool.node._answer import answer
from dpool.objects import payload as _payload
from dpool.protocol import messages as m
from dpool.scheduling import SchedulerAPI


class KeyValues:
    def __init__(self, scheduler: SchedulerAPI, control: ClusterControlStore) -> None:
        self._s = scheduler
        self._control = control
        scheduler.register_handler(m.KVPut.CODE, self._on_put_locked)
        scheduler.register_handler(m.KVGet.CODE, self._on_get_locked)

    def _on_put_locked(self, h: Any, msg: m.KVPut) -> None:
        self._off(h, msg.request_id,
                  lambda: self._control.put_value(msg.key, msg.value, msg.ttl_s))

    def _on_get_locked(self, h: Any, msg: m.KVGet) -> None:
        self._off(h, msg.request_id, lambda: self._control.get_value(msg.key))

    def _off(self, h: Any, request_id: int, work: Callable[[], Any]) -> None:
        threading.Thread(target=self._answer, args=(h, request_id, work), daemon=True,
                         name="dpool-kv").start()

    def _answer(self, h: Any, request_id: int, work: Callable[[], Any]) -> None:
        try:
            ok, payload = True, _payload.dumps(work())
        except Exception as exc:  # noqa: BLE001 - the asker raises it
            ok, payload = False, _payload.dumps_error(exc)
        answer(self._s, h, request_id, ok, payload)
