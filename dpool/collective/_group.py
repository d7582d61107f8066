"""A collective group as one member sees it: its links, its shared memory (when every
member is on this node), and the operations over them.

Members on one node exchange through shared memory (``_shm``); otherwise over their TCP
links (``_mesh``), which point-to-point ``send``/``recv`` always use. Each operation has
a sequence number; its members first agree on what they call (the operation, dtype,
shape, root, reduction). Any failure -- a member lost, a disagreement, a timeout --
aborts the group in this member (its links closed with the reason, the shared abort flag
set) and raises ``CollectiveError``; so do the group's later calls, until it is
destroyed and formed again.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any, Optional

import numpy as np

from dpool.collective import _arrays, _mesh, _shm, _wire
from dpool.collective._wire import DATA, META, Recv, Send, abort, transfer
from dpool.errors import CollectiveError


class Group:
    def __init__(self, name: str, world: int, rank: int, table: list, links: dict,
                 token: str, timeout: Optional[float], transport: str = "auto") -> None:
        self.name = name
        self.world = world
        self.rank = rank
        self.table = table
        self.links = links
        self.timeout = timeout  # of one operation (None: none)
        self.seq = 0
        self.broken: Optional[CollectiveError] = None
        self._pickled: dict[tuple, bytes] = {}  # an operation's metadata, pickled
        same = {(i["node"], i["boot"]) for i in table}
        transport = table[0].get("transport", transport)  # (rank 0's: every member alike)
        local = len(same) == 1 and transport != "tcp"
        if world > (os.cpu_count() or 1):
            _wire.spin = False  # (this process's groups: members outnumber the CPUs)
        self.arena: Optional[_shm.Arena] = \
            _shm.Arena(name, world, rank, [i["pid"] for i in table], token) if local else None

    @property
    def transport(self) -> str:
        return "shm" if self.arena is not None else "tcp"

    def deadline(self) -> Optional[float]:
        return None if self.timeout is None else time.monotonic() + self.timeout

    # -- running one operation -----------------------------------------------------------
    def run(self, what: str, fn: Any, *args: Any, collective: bool = True) -> Any:
        if self.broken is not None:
            raise CollectiveError(f"collective group {self.name!r} failed earlier and "
                                  f"cannot be used ({self.broken}); destroy_group() it and "
                                  "form it again", group=self.name, rank=self.broken.rank)
        if collective:  # (every member numbers them alike: not send/recv)
            self.seq += 1
        try:
            return fn(*args)
        except CollectiveError as exc:
            self._fail(exc)
            raise
        except Exception as exc:  # noqa: BLE001 - mid-operation: the others must hear it
            err = CollectiveError(f"collective group {self.name!r}: {what} failed in rank "
                                  f"{self.rank}: {exc!r}", group=self.name, rank=self.rank)
            self._fail(err)
            raise err from exc

    def _fail(self, exc: CollectiveError) -> None:
        self.broken = exc
        abort(list(self.links.values()), str(exc), exc.rank)
        if self.arena is not None:
            try:
                self.arena.abort(str(exc), exc.rank)
            except CollectiveError:
                pass

    def disagree(self, r: int, first: tuple, m: tuple) -> None:
        raise CollectiveError(
            f"collective group {self.name!r}: the members disagree -- rank {self.rank} "
            f"called {first[0]}{first[1:]!r}, rank {r} called {m[0]}{m[1:]!r}",
            group=self.name, rank=r)

    def agree(self, meta: tuple, same: bool = True) -> list:
        """Every member's ``meta`` (TCP: one small exchange), checked as ``_shm`` does."""
        metas = [pickle.loads(b) for b in  # noqa: S301 - from members of this group
                 _mesh.exchange_all(self, pickle.dumps(meta), META, self.seq)]
        first = metas[0]
        for r, m in enumerate(metas):
            if m[0] != first[0] or (same and m != first):
                raise CollectiveError(
                    f"collective group {self.name!r}: the members disagree -- rank 0 "
                    f"called {first[0]}{first[1:]!r}, rank {r} called {m[0]}{m[1:]!r}",
                    group=self.name, rank=r)
        return metas

    # -- the operations ------------------------------------------------------------------
    def allreduce(self, arr: np.ndarray, ufunc: Any, opname: str,
                  out: np.ndarray) -> None:
        arena = self.arena
        if arena is not None and self.broken is None:  # (the hot path, inline)
            self.seq += 1
            try:
                _shm.allreduce(arena, arr, ufunc, out, opname, self.timeout)
            except CollectiveError as exc:
                self._fail(exc)
                raise
            except Exception as exc:  # noqa: BLE001 - mid-operation: the others must know
                err = CollectiveError(f"collective group {self.name!r}: allreduce failed "
                                      f"in rank {self.rank}: {exc!r}", group=self.name,
                                      rank=self.rank)
                self._fail(err)
                raise err from exc
            return

        def go() -> None:
            if self.arena is not None:
                _shm.allreduce(self.arena, arr, ufunc, out, opname, self.timeout)
                return
            meta = ("allreduce", arr.dtype.str, arr.shape, opname)
            pickled = self._pickled.get(meta)
            if pickled is None:
                pickled = self._pickled[meta] = pickle.dumps(meta)
                if len(self._pickled) > 64:
                    self._pickled.clear()
            _mesh.allreduce(self, arr, ufunc, out, self.seq, pickled)

        self.run("allreduce", go)

    def reducescatter(self, arr: np.ndarray, ufunc: Any, opname: str) -> np.ndarray:
        def go() -> np.ndarray:
            if self.arena is not None:
                lo, hi = _arrays.row_chunks(arr.shape, self.world)[self.rank]
                out = np.empty(_arrays.row_shape(arr.shape, lo, hi), dtype=arr.dtype)
                _shm.allreduce(self.arena, arr, ufunc, out, opname, self.timeout,
                               rows=True)
                return out
            self.agree(("reducescatter", arr.dtype.str, arr.shape, opname))
            return _mesh.reducescatter(self, arr, ufunc, self.seq)

        return self.run("reducescatter", go)

    def broadcast(self, arr: Optional[np.ndarray], root: int) -> np.ndarray:
        def go() -> np.ndarray:
            if self.arena is not None:
                return _shm.broadcast(self.arena, arr, root, self.timeout)
            held = (arr.dtype.str, arr.shape) if arr is not None else None
            metas = self.agree(("broadcast", root, held), same=False)
            for r, m in enumerate(metas):
                if m[1] != root:
                    raise CollectiveError(
                        f"collective group {self.name!r}: the members disagree on the "
                        f"root of broadcast (rank {self.rank} said {root}, rank {r} said "
                        f"{m[1]})", group=self.name, rank=r)
            dtype, shape = metas[root][2]
            return _mesh.broadcast(self, arr, root, dtype, shape, self.seq)

        return self.run("broadcast", go)

    def allgather(self, arr: np.ndarray) -> list:
        def go() -> list:
            if self.arena is not None:
                return _shm.allgather(self.arena, arr, self.timeout)
            metas = self.agree(("allgather", arr.dtype.str, arr.shape), same=False)
            return _mesh.allgather(self, arr, [m[1:] for m in metas], self.seq)

        return self.run("allgather", go)

    def barrier(self) -> None:
        def go() -> None:
            if self.arena is not None:
                _shm.barrier(self.arena, self.timeout)
            else:
                self.agree(("barrier",))

        self.run("barrier", go)

    def send(self, arr: np.ndarray, dst: int) -> None:
        link = self.links[dst]
        head = pickle.dumps((arr.dtype.str, arr.shape))

        def go() -> None:
            transfer(self.name, [Send(link, META, 0, head),
                                 Send(link, DATA, 0, arr.reshape(-1).data)],
                     self.deadline())

        self.run("send", go, collective=False)

    def recv(self, src: int) -> np.ndarray:
        link = self.links[src]

        def go() -> np.ndarray:
            r = Recv(link, META, 0)
            transfer(self.name, [r], self.deadline())
            dtype, shape = pickle.loads(r.payload())  # noqa: S301 - a member's
            out = np.empty(shape, dtype=np.dtype(dtype))
            transfer(self.name, [Recv(link, DATA, 0, out.reshape(-1).data)],
                     self.deadline())
            return out

        return self.run("recv", go, collective=False)

    # -- the end -------------------------------------------------------------------------
    def abandon(self, exc: BaseException) -> None:
        """This member cannot take part in the operation it was called for (bad input):
        the others fail theirs at once instead of waiting for it."""
        if self.broken is None:
            self._fail(CollectiveError(f"collective group {self.name!r}: the member of "
                                       f"rank {self.rank} gave up on an operation: {exc}",
                                       group=self.name, rank=self.rank))

    def close(self) -> None:
        if self.broken is None:  # (a member mid-operation must not wait for this one)
            self._fail(CollectiveError(f"collective group {self.name!r}: the member of "
                                       f"rank {self.rank} left the group (destroy_group)",
                                       group=self.name, rank=self.rank))
        for link in self.links.values():
            link.close()
        if self.arena is not None:
            self.arena.close()
            self.arena = None
