"""The local scheduler's IO thread: one selector over every worker socket.

It reads whatever frames the workers sent, hands them to the scheduler, and finishes
writes the kernel would not take at once. Other threads wake it through a self-pipe to
register sockets or ask for write interest; it never blocks on a single peer.

Leader/follower reads: a driver thread about to block on a task's result may take a
worker socket over (``suspend``): the loop stops polling it for input (one ``epoll_ctl``,
safe while this thread sits in ``epoll_wait``) and the waiting thread reads it itself, so
the result wakes the thread that wants it, not this one (which would then have to wake
that one: a futex wake and a GIL hand-off; bench/NOTES.md has the figure). ``resume``
gives the socket back. Every read of a socket, here or by a leader, holds its channel's
``read_lock`` until its frames are handled, so one peer's messages are handled in order.

The tick: ``on_tick`` runs every ``_TICK_S`` while it has periodic work (it returns
whether it still has: releases queued, tasks waiting for resources, spilled tasks away,
writes to flush...), at the latest ``_TICK_S`` after any input. When it has none, the
loop sleeps until woken -- input, a command, ``poke()`` -- or ``_IDLE_TICK_S`` passes (a
safety net): an idle process costs next to nothing (bench/IDLE.md). Whoever queues
tick work from another thread calls ``poke()``,
which costs an attribute read while the loop ticks anyway (``idle`` is False).
"""

from __future__ import annotations

import os
import select
import selectors
import threading
import time

from dpool import _log
from dpool.protocol import ChannelClosed

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

log = _log.getLogger("dpool.scheduling")

_TICK_S = 0.05
_IDLE_TICK_S = 1.0  # the longest sleep of a loop whose tick has nothing to look at
SPIN_S = 50e-6  # a leader polls without sleeping this long for a task expected to end by then
LEAD_S = 0.01  # a thread reads a socket itself this long at most (lead)


class IOLoop:
    def __init__(self, on_frames: Callable[[Any, list], None],
                 on_closed: Callable[[Any], None], on_tick: Callable[[], object]) -> None:
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
        # Leader/follower: the raw epoll object (None where the selector is not epoll:
        # then nobody leads), the fds a leader reads now, and the lock that keeps this
        # thread's mask changes and a leader's apart.
        self._epoll = getattr(self._sel, "_selector", None) \
            if isinstance(self._sel, getattr(selectors, "EpollSelector", ())) else None
        self._led: set[int] = set()
        self._mask_lock = threading.Lock()
        self._stop = False
        # True while the tick has nothing to look at (the loop may sleep ``_IDLE_TICK_S``)
        self.idle = False
        self.inputs = 0  # reads of a peer's input (or its close): a hint that state changed
        self.on_input: Optional[Callable[[], None]] = None  # called after rounds that read
        self._thread = threading.Thread(target=self._run, name="dpool-scheduler-io",
                                        daemon=True)
        self._ident: Optional[int] = None  # the thread's, set first thing on it
        # The thread starts when first needed (a command, a wake-up), after
        # ``before_start()``: the owner's last moment without this thread (the fork
        # server is forked then, ``scheduling._zygote``).
        self.before_start: Optional[Callable[[], None]] = None
        self._started = False
        self._start_lock = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether the loop's thread was started."""
        return self._started

    def start(self) -> None:
        """Start the loop's thread now, if it has not started (any thread; a call while
        another one starts it -- on another thread, or further up this one's stack, from
        a finalizer -- returns at once: the thread runs soon, and then sees what the
        caller queued)."""
        if self._started or not self._start_lock.acquire(blocking=False):
            return
        try:
            if not self._started:
                if self.before_start is not None:
                    self.before_start()
                self._thread.start()
                self._started = True
        finally:
            self._start_lock.release()

    # -- called from any thread ----------------------------------------------------------
    def add(self, handle: Any) -> None:
        self._command(("add", handle))

    def want_write(self, handle: Any) -> None:
        self._command(("write", handle))

    def wake(self) -> None:
        if not self._started:
            self.start()
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending (or we are closing)

    def poke(self) -> None:
        """There is work for the tick (queued from another thread): tick again within
        ``_TICK_S`` even if the loop was idle. Any thread; no lock taken."""
        if self.idle or not self._started:
            self.idle = False
            self.wake()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the IO thread (errors are logged)."""
        self._command(("call", fn))

    def suspend(self, fd: int) -> bool:
        """Stop polling ``fd`` for input: the calling thread reads it until ``resume``."""
        if self._epoll is None or self._stop:
            return False
        with self._mask_lock:
            if fd in self._led:
                return False
            try:
                key = self._sel.get_key(fd)
            except (KeyError, ValueError, RuntimeError):
                return False  # not registered (yet), or gone
            self._led.add(fd)
            try:
                self._epoll.modify(fd, select.EPOLLOUT if key.events & selectors.EVENT_WRITE else 0)
            except (OSError, ValueError):
                self._led.discard(fd)
                return False
            return True

    def resume(self, fd: int) -> None:
        """Poll ``fd`` for input again (input that came meanwhile wakes the loop)."""
        with self._mask_lock:
            self._led.discard(fd)
            try:
                key = self._sel.get_key(fd)
                self._set_mask(fd, key.events)
            except (KeyError, ValueError, RuntimeError, OSError):
                pass  # closed and unregistered meanwhile

    def _set_mask(self, fd: int, events: int) -> None:
        """The epoll mask for ``events``, less input while a leader reads ``fd`` (mask lock
        held)."""
        mask = (select.EPOLLIN if events & selectors.EVENT_READ and fd not in self._led else 0) \
            | (select.EPOLLOUT if events & selectors.EVENT_WRITE else 0)
        self._epoll.modify(fd, mask)  # type: ignore[union-attr]

    def _modify(self, fd: int, events: int, handle: Any) -> None:
        with self._mask_lock:
            self._sel.modify(fd, events, handle)
            if fd in self._led:
                self._set_mask(fd, events)

    def lead(self, handle: Any, future: Any, timeout: Optional[float],
             spin: bool, handle_frames: Callable[[list], Any],
             deliver: Callable[[Any], None], on_error: Callable[[], None]
             ) -> Optional[float]:
        """Read ``handle``'s socket on the calling thread until ``future`` is done (at most
        ``LEAD_S`` and ``timeout``), the loop leaving it alone meanwhile: each read's
        frames go to ``handle_frames`` (under the channel's read lock), what that
        returns (if anything) to ``deliver`` after it. ``spin``: poll without sleeping
        for the first ``SPIN_S`` -- waking a sleeping thread is slow on a VM whose idle
        vCPU halts (bench/NOTES.md: what the spin saves a round trip). An error
        is logged and ``on_error()`` called. Returns what is left of ``timeout``
        (``timeout`` itself if the socket could not be taken over)."""
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        chan = handle.chan
        fd = chan.fileno
        if not self.suspend(fd):
            return timeout
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            end = now + LEAD_S if deadline is None else min(deadline, now + LEAD_S)
            spin_end = now + SPIN_S if spin else now
            while not future.done() and handle.alive:
                t = time.monotonic()
                left = end - t
                if left <= 0:
                    break
                if t < spin_end:
                    if not poller.poll(0):
                        continue
                # Slices of 1 ms: the IO thread may have read the result just before
                # it left the socket alone; then only future.done() tells.
                elif not poller.poll(min(left, 0.001) * 1000.0 + 0.5):
                    continue
                with chan.read_lock:
                    try:
                        frames = chan.recv_ready()
                    except ChannelClosed:
                        break  # the IO thread sees the EOF too and handles it
                    if not frames:
                        continue
                    out = handle_frames(frames)
                if out:
                    deliver(out)
        except Exception:  # noqa: BLE001 - as the IO loop does: the peer is dropped
            log.exception("dpool: error handling what %s sent", handle.worker_id)
            on_error()
        finally:
            self.resume(fd)
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def stop(self) -> None:
        self._stop = True
        with self._start_lock:
            if not self._started:  # never needed: nothing to stop
                self._started = True  # (nor to start, from now on)
                return
        self.wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def is_io_thread(self) -> bool:
        # get_ident(): one C call; current_thread() (or Thread.ident, a property) costs
        # more, on every submit
        return threading.get_ident() == self._ident

    def _command(self, cmd: tuple) -> None:
        with self._cmd_lock:
            self._cmds.append(cmd)
        self.wake()

    # -- the loop ------------------------------------------------------------------------
    def _apply_commands(self) -> None:
        with self._cmd_lock:
            cmds, self._cmds = self._cmds, []
        for kind, handle in cmds:
            if kind == "call":
                try:
                    handle()
                except Exception:  # noqa: BLE001 - the loop must outlive it
                    log.exception("dpool scheduler: a call on the IO thread failed")
                continue
            chan = handle.chan
            try:
                if kind == "add":
                    with self._mask_lock:
                        self._sel.register(chan.fileno, selectors.EVENT_READ, handle)
                elif kind == "write" and handle.alive:
                    self._modify(chan.fileno, selectors.EVENT_READ | selectors.EVENT_WRITE,
                                 handle)
            except (KeyError, ValueError, OSError):
                pass  # the worker went away meanwhile

    def close_handle(self, handle: Any) -> None:
        """Treat ``handle`` as closed (IO thread only): a leader failed handling its input."""
        self._closed(handle)

    def _closed(self, handle: Any) -> None:
        try:
            with self._mask_lock:
                self._sel.unregister(handle.chan.fileno)
        except (KeyError, ValueError, OSError):
            pass
        try:
            self._on_closed(handle)
        except Exception:  # noqa: BLE001 - the loop must outlive any one worker's end
            log.exception("dpool scheduler: error handling the end of worker %s",
                          handle.worker_id)

    def _run(self) -> None:
        self._ident = threading.get_ident()
        last_tick = time.monotonic()
        timeout = _TICK_S
        while not self._stop:
            try:
                events = self._sel.select(timeout)
            except OSError:  # pragma: no cover - interrupted during interpreter shutdown
                break
            inputs = self.inputs
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
                        self.inputs += 1
                        chan = handle.chan
                        with chan.read_lock:  # a leader may be reading it (suspend)
                            frames = chan.recv_ready()
                            if frames:
                                self._on_frames(handle, frames)
                    if mask & selectors.EVENT_WRITE:
                        if handle.chan.flush():
                            self._modify(handle.chan.fileno, selectors.EVENT_READ, handle)
                except ChannelClosed:
                    self._closed(handle)
                except Exception:  # noqa: BLE001 - one bad peer must not kill the loop
                    log.exception("dpool scheduler: error handling worker %s", handle.worker_id)
                    self._closed(handle)
            if self.inputs != inputs and self.on_input is not None:
                try:
                    self.on_input()
                except Exception:  # noqa: BLE001 - the loop must outlive it
                    log.exception("dpool scheduler: an input hook failed")
            now = time.monotonic()
            ticked = not events or now - last_tick >= _TICK_S
            if ticked:
                last_tick = now
                self.idle = True  # from here on, a poke() wakes the loop
                try:
                    if self._on_tick():
                        self.idle = False  # more to look at: tick again soon
                except Exception:  # noqa: BLE001
                    self.idle = False
                    log.exception("dpool scheduler: periodic work failed")
            # after input that no tick has followed yet, one does within _TICK_S: it
            # looks at what the input left (and says whether the loop may go idle)
            timeout = _TICK_S if not self.idle or (events and not ticked) else _IDLE_TICK_S
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
