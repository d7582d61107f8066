"""The local scheduler's IO thread: one selector over every worker socket.

It reads whatever frames the workers sent, hands them to the scheduler, and finishes
writes the kernel would not take at once. Other threads wake it through a self-pipe to
register sockets or ask for write interest; it never blocks on a single peer.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from typing import Any, Callable

from dpool.protocol import ChannelClosed

log = logging.getLogger("dpool.scheduling")

_TICK_S = 0.05


class IOLoop:
    def __init__(self, on_frames: Callable[[Any, list], None],
                 on_closed: Callable[[Any], None], on_tick: Callable[[], None]) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._on_frames = on_frames
        self._on_closed = on_closed
        self._on_tick = on_tick
        self._cmds: list = []
        self._cmd_lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="dpool-scheduler-io",
                                        daemon=True)
        self._thread.start()

    # -- called from any thread ----------------------------------------------------------
    def add(self, handle: Any) -> None:
        self._command(("add", handle))

    def want_write(self, handle: Any) -> None:
        self._command(("write", handle))

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending (or we are closing)

    def stop(self) -> None:
        self._stop = True
        self.wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def is_io_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _command(self, cmd: tuple) -> None:
        with self._cmd_lock:
            self._cmds.append(cmd)
        self.wake()

    # -- the loop ------------------------------------------------------------------------
    def _apply_commands(self) -> None:
        with self._cmd_lock:
            cmds, self._cmds = self._cmds, []
        for kind, handle in cmds:
            chan = handle.chan
            try:
                if kind == "add":
                    self._sel.register(chan.fileno, selectors.EVENT_READ, handle)
                elif kind == "write" and handle.alive:
                    self._sel.modify(chan.fileno, selectors.EVENT_READ | selectors.EVENT_WRITE,
                                     handle)
            except (KeyError, ValueError, OSError):
                pass  # the worker went away meanwhile

    def _closed(self, handle: Any) -> None:
        try:
            self._sel.unregister(handle.chan.fileno)
        except (KeyError, ValueError, OSError):
            pass
        try:
            self._on_closed(handle)
        except Exception:  # noqa: BLE001 - the loop must outlive any one worker's end
            log.exception("dpool scheduler: error handling the end of worker %s",
                          handle.worker_id)

    def _run(self) -> None:
        last_tick = time.monotonic()
        while not self._stop:
            try:
                events = self._sel.select(_TICK_S)
            except OSError:  # pragma: no cover - interrupted during interpreter shutdown
                break
            for key, mask in events:
                handle = key.data
                if handle is None:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    self._apply_commands()
                    continue
                try:
                    # read first: results already sent by a worker whose socket then
                    # broke are still delivered before the EPIPE of a flush closes it
                    if mask & selectors.EVENT_READ:
                        frames = handle.chan.recv_ready()
                        if frames:
                            self._on_frames(handle, frames)
                    if mask & selectors.EVENT_WRITE:
                        if handle.chan.flush():
                            self._sel.modify(handle.chan.fileno, selectors.EVENT_READ, handle)
                except ChannelClosed:
                    self._closed(handle)
                except Exception:  # noqa: BLE001 - one bad peer must not kill the loop
                    log.exception("dpool scheduler: error handling worker %s", handle.worker_id)
                    self._closed(handle)
            now = time.monotonic()
            if not events or now - last_tick >= _TICK_S:
                last_tick = now
                try:
                    self._on_tick()
                except Exception:  # noqa: BLE001
                    log.exception("dpool scheduler: periodic work failed")
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
