"""Small adapter interfaces every peer implements.

``ExecutorPeer`` covers the ``executor`` and ``objects`` groups (submit one
call, get its result, optionally ``put`` an object once); ``PoolPeer`` covers
the ``multiprocessing.Pool``-style API of the ``pool`` group.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, ClassVar, TypeVar

Fn = Callable[..., Any]
Self = TypeVar("Self", bound="Adapter")


class PeerUnavailable(Exception):
    """The peer cannot run here (not installed, API missing); skip it."""


class Unsupported(Exception):
    """The peer has no equivalent of this operation; skip the workload."""


class Adapter(ABC):
    #: creating + shutting down takes seconds (Ray, dask): fewer start-up reps
    heavy_startup: ClassVar[bool] = False

    def __init__(self, workers: int) -> None:
        self.workers = workers

    @classmethod  # noqa: B027 (optional hook, a no-op by default)
    def check(cls) -> None:
        """Raise ``PeerUnavailable`` if the API this adapter needs is missing."""

    @abstractmethod
    def open(self) -> None:
        """Create the executor/pool (timed by the start-up workload)."""

    @abstractmethod
    def close(self) -> None:
        """Shut everything down; no process may survive this."""

    def __enter__(self: Self) -> Self:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ExecutorPeer(Adapter):
    supports_put: ClassVar[bool] = False

    @abstractmethod
    def submit(self, fn: Fn, /, *args: Any) -> Any:
        """Schedule ``fn(*args)`` and return a handle."""

    @abstractmethod
    def result(self, handle: Any) -> Any:
        """Block until one handle is done and return its value."""

    def results(self, handles: Sequence[Any]) -> list[Any]:
        """Block until all handles are done; return their values in order."""
        return [self.result(h) for h in handles]

    def put(self, obj: Any) -> Any:
        """Store ``obj`` once and return a reference tasks can take."""
        raise Unsupported(f"{type(self).__name__} has no put()")


class PoolPeer(Adapter):
    @abstractmethod
    def map(self, fn: Fn, items: Sequence[Any]) -> list[Any]: ...

    @abstractmethod
    def imap_unordered(self, fn: Fn, items: Iterable[Any], chunksize: int) -> Iterator[Any]: ...

    @abstractmethod
    def apply(self, fn: Fn, args: tuple[Any, ...]) -> Any: ...


class FuturesExecutorPeer(ExecutorPeer):
    """Any ``concurrent.futures.Executor``: PPE, loky, dpool."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._ex: Any = None

    @abstractmethod
    def _create(self) -> Any: ...

    def open(self) -> None:
        self._ex = self._create()

    def submit(self, fn: Fn, /, *args: Any) -> Any:
        return self._ex.submit(fn, *args)

    def result(self, handle: Any) -> Any:
        return handle.result()

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True)
            self._ex = None


class MpStylePool(PoolPeer):
    """Anything exposing the ``multiprocessing.Pool`` API."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self._pool: Any = None

    @abstractmethod
    def _create(self) -> Any: ...

    def open(self) -> None:
        self._pool = self._create()

    def map(self, fn: Fn, items: Sequence[Any]) -> list[Any]:
        return list(self._pool.map(fn, items))

    def imap_unordered(self, fn: Fn, items: Iterable[Any], chunksize: int) -> Iterator[Any]:
        return iter(self._pool.imap_unordered(fn, items, chunksize=chunksize))

    def apply(self, fn: Fn, args: tuple[Any, ...]) -> Any:
        return self._pool.apply(fn, args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None
