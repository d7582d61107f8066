"""``dpool.progress``: a progress bar over futures, map/imap iterators and AsyncResults.

The bar is tqdm's when tqdm is installed (``pip install 'dpool[progress]'``), else a plain
line rewritten in place: done/total, percent, rate, ETA and failures. Wrapping changes
nothing the caller gets: the same items in the same order, the same exceptions, the same
AsyncResult.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import IO, Any, TypeVar

T = TypeVar("T")


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    mi, s = divmod(rest, 60)
    return f"{h}:{mi:02d}:{s:02d}" if h else f"{mi:02d}:{s:02d}"


class PlainBar:
    """One line, rewritten with ``\\r`` at most every ``interval`` seconds."""

    def __init__(self, total: int | None, desc: str, file: IO[str],
                 interval: float = 0.2) -> None:
        self.total, self.desc, self.file, self.interval = total, desc, file, interval
        self.done = self.failed = 0
        self.t0 = time.monotonic()
        self._shown = 0.0
        self._width = 0
        self._lock = threading.Lock()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        rate = self.done / elapsed
        head = f"{self.desc}: " if self.desc else ""
        if self.total:
            pct = 100.0 * self.done / self.total
            left = (self.total - self.done) / rate if rate > 0 else None
            eta = f"ETA {_eta(left)}" if left is not None else "ETA ?"
            text = f"{head}{self.done}/{self.total} [{pct:3.0f}%] {rate:.1f} tasks/s {eta}"
        else:
            text = f"{head}{self.done} done {rate:.1f} tasks/s elapsed {_eta(elapsed)}"
        return text + (f", {self.failed} failed" if self.failed else "")

    def _show(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._shown < self.interval:
            return
        self._shown = now
        text = self.line()
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        try:
            self.file.write("\r" + text + pad)
            self.file.flush()
        except (OSError, ValueError):  # a closed stream: nothing to show
            pass

    def update(self, n: int = 1, failed: int = 0) -> None:
        with self._lock:
            self.done += n
            self.failed += failed
            self._show()

    def close(self) -> None:
        with self._lock:
            self._show(force=True)
            try:
                self.file.write("\n")
                self.file.flush()
            except (OSError, ValueError):
                pass


class _TqdmBar:
    def __init__(self, total: int | None, desc: str, file: IO[str]) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=desc or None, file=file, unit="task",
                         dynamic_ncols=True)
        self.failed = 0
        self._lock = threading.Lock()

    @property
    def done(self) -> int:
        return int(self._bar.n)

    def update(self, n: int = 1, failed: int = 0) -> None:
        with self._lock:
            if failed:
                self.failed += failed
                self._bar.set_postfix(failed=self.failed, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        self._bar.close()


def make_bar(total: int | None, desc: str = "", file: IO[str] | None = None) -> Any:
    """tqdm's bar when tqdm can be imported, else ``PlainBar``."""
    out = file if file is not None else sys.stderr
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return PlainBar(total, desc, out)
    return _TqdmBar(total, desc, out)


def _failed(item: Any) -> int:
    return int(isinstance(item, Future) and item.done() and not item.cancelled()
               and item.exception(timeout=0) is not None)


def _over_futures(fs: list, bar: Any) -> Iterator[Any]:
    """Yield ``fs`` in order, each once done; the bar counts completions as they come."""
    def done(f: Future) -> None:
        bar.update(1, int(not f.cancelled() and f.exception(timeout=0) is not None))

    try:
        for f in fs:
            f.add_done_callback(done)
        for f in fs:
            try:
                f.exception()  # waits (as f.result() in the caller's loop would)
            except BaseException:  # noqa: BLE001 - cancelled: the caller sees it from f
                pass
            yield f
    finally:
        bar.close()


def _over_iterator(it: Iterable[T], bar: Any) -> Iterator[T]:
    iterator = iter(it)
    try:
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                return
            except BaseException:
                bar.update(0, 1)
                raise
            bar.update(1, _failed(item))
            yield item
    finally:
        bar.close()


def _is_async_result(x: Any) -> bool:
    return all(callable(getattr(x, a, None)) for a in ("ready", "get", "wait")) and \
        not isinstance(x, Future)


def _chunks_left(ar: Any) -> int | None:
    """Chunks of a ``MapResult`` still running (None for another AsyncResult)."""
    left = getattr(ar, "_number_left", None)
    return left if isinstance(left, int) else None


def _chunks_total(ar: Any) -> int | None:
    """All chunks of a ``MapResult``, also those done already (its ``_value`` list and
    ``_chunksize``, as the stdlib's has them); else what ``_chunks_left`` says."""
    size = getattr(ar, "_chunksize", None)
    value = getattr(ar, "_value", None)
    if isinstance(size, int) and size > 0 and isinstance(value, list):
        return len(value) // size + bool(len(value) % size)
    return _chunks_left(ar)


def _wait_async(ar: Any, bar: Any, total: int, chunks: int, poll: float) -> Any:
    """Block until ``ar`` is ready, the bar following its chunks; return ``ar``."""
    shown = 0
    try:
        while True:
            ready = ar.ready()
            left = _chunks_left(ar)
            if ready:
                done = total
            elif left is not None and chunks:
                done = total * max(0, chunks - left) // chunks
            else:
                done = 0
            if done > shown:
                bar.update(done - shown)
                shown = done
            if ready:
                if not ar.successful():
                    bar.update(0, 1)
                return ar
            ar.wait(poll)
    finally:
        bar.close()


def progress(x: Iterable[T] | Any, total: int | None = None, desc: str = "", *,
             file: IO[str] | None = None, poll: float = 0.1) -> Any:
    """Show a progress bar (done/total, rate, ETA, failures) while ``x`` completes.

    - an iterable of futures (a list, a set...): yields them in their order, each once it
      is done; the bar counts them as they complete, in any order;
    - a ``map``/``imap``/``imap_unordered``/``as_completed`` iterator (any iterable):
      yields what it yields, counting each item (``total`` when it has no ``len``);
    - an ``AsyncResult``/``MapResult``: waits for it with the bar (over its chunks) and
      returns it, so ``dpool.progress(pool.map_async(f, xs)).get()`` is the list.

    tqdm draws the bar when it is installed, else one plain line on ``file`` (stderr).
    """
    if _is_async_result(x):
        # (all of them: some may be done before the bar starts, and the bar shows them)
        chunks = _chunks_total(x) or 1
        n = chunks if total is None else total
        return _wait_async(x, make_bar(n, desc, file), n, chunks, poll)
    if not isinstance(x, Iterable):
        raise TypeError("progress() takes an iterable of futures, a map/imap iterator or an "
                        f"AsyncResult, not {type(x).__name__}")
    if total is None:
        try:
            total = len(x)  # type: ignore[arg-type]
        except TypeError:
            total = None
    if isinstance(x, (list, tuple, set, frozenset)) and x and \
            all(isinstance(f, Future) for f in x):
        return _over_futures(list(x), make_bar(total, desc, file))
    return _over_iterator(x, make_bar(total, desc, file))
