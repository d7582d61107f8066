"""Collectives over the members' TCP links (members on different nodes).

Large arrays go around a ring -- reduce-scatter, then all-gather: in 2(n-1) steps each
member sends and receives 2(n-1)/n of the array, the bandwidth-optimal amount; each step
sends to the right neighbour while it receives from the left (``_wire.transfer``).
Small ones (below ``SMALL`` bytes) go to every member at once, which reduces them
itself: one step, the latency-optimal way for the few members a group has. Reduction
order: a ring's chunk ``k`` accumulates the members' values in ring order starting at
rank ``k + 1`` (``((x[k+1] op x[k+2]) op ...) op x[k]``); the all-to-all way, in rank
order. Every member gets the same bits either way.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, Optional

import numpy as np

from dpool.collective import _arrays
from dpool.collective._wire import DATA, Recv, Send, transfer

SMALL = 64 * 1024
PIECE = 1 << 20  # a ring step's frames: reduced one by one as they arrive
_HEAD = struct.Struct("!I")


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1)


def exchange_all(g: Any, payload: bytes, kind: int, seq: int) -> list:
    """Every member's ``payload`` (bytes), in rank order (this member's own included)."""
    ops: list = []
    recvs = {}
    for r, link in g.links.items():
        ops.append(Send(link, kind, seq, payload))
        recvs[r] = Recv(link, kind, seq)
        ops.append(recvs[r])
    transfer(g.name, ops, g.deadline())
    return [payload if r == g.rank else recvs[r].payload() for r in range(g.world)]


def allreduce(g: Any, arr: np.ndarray, ufunc: Any, out: np.ndarray, seq: int,
              meta: bytes) -> None:
    """``meta``: what the members must agree on, pickled (small arrays: sent with them;
    large ones: exchanged first)."""
    n = g.world
    if n == 1:
        np.copyto(out, arr)
        return
    if arr.nbytes < SMALL:
        _reduce_all_to_all(g, arr, ufunc, out, seq, meta)
        return
    g.agree(pickle.loads(meta))  # noqa: S301 - (its own)
    acc = _flat(out)
    np.copyto(acc, _flat(arr))
    bounds = _arrays.chunks(acc.size, n)
    _reduce_scatter(g, acc, ufunc, bounds, seq)
    _all_gather(g, acc, bounds, seq)


def reducescatter(g: Any, arr: np.ndarray, ufunc: Any, seq: int) -> np.ndarray:
    """This member's chunk (axis 0, as ``numpy.array_split``) of the reduced array."""
    n = g.world
    bounds = _arrays.row_chunks(arr.shape, n)
    lo, hi = bounds[g.rank]
    shape = _arrays.row_shape(arr.shape, lo, hi)
    if n == 1:
        return arr.copy()
    if arr.nbytes < SMALL:
        full = np.empty_like(arr)
        _reduce_all_to_all(g, arr, ufunc, full, seq)
        return _flat(full)[lo:hi].reshape(shape).copy()
    acc = _flat(arr).copy()
    _reduce_scatter(g, acc, ufunc, bounds, seq)
    return acc[lo:hi].reshape(shape)


def _reduce_all_to_all(g: Any, arr: np.ndarray, ufunc: Any, out: np.ndarray,
                       seq: int, meta: bytes = b"") -> None:
    """Every member's array to every member, each reducing them in rank order; with
    ``meta`` (the operation's metadata, pickled) in the same frame, checked first."""
    head = _HEAD.pack(len(meta)) + meta
    parts = exchange_all(g, head + arr.tobytes(), DATA, seq)
    views = []
    for r, p in enumerate(parts):
        (n,) = _HEAD.unpack_from(p)
        if p[4:4 + n] != meta:
            g.disagree(r, pickle.loads(meta), pickle.loads(p[4:4 + n]))  # noqa: S301
        views.append(np.frombuffer(p, dtype=arr.dtype, offset=4 + n))
    flat = _flat(out)
    np.copyto(flat, views[0])
    for v in views[1:]:
        ufunc(flat, v, out=flat)


def _neighbours(g: Any) -> tuple:
    return g.links[(g.rank + 1) % g.world], g.links[(g.rank - 1) % g.world]


def _reduce_scatter(g: Any, acc: np.ndarray, ufunc: Any, bounds: list, seq: int) -> None:
    """After it, ``acc``'s chunk ``rank`` holds that chunk reduced over every member."""
    n, r = g.world, g.rank
    right, left = _neighbours(g)
    biggest = max(hi - lo for lo, hi in bounds)
    tmp = np.empty(biggest, dtype=acc.dtype)
    step = max(1, PIECE // acc.itemsize)
    for s in range(n - 1):
        out_c = (r - s - 1) % n
        in_c = (r - s - 2) % n
        olo, ohi = bounds[out_c]
        ilo, ihi = bounds[in_c]
        # In pieces, each its own frame: a piece is reduced as soon as it is in, while
        # the next ones arrive (both sides cut a chunk alike)
        ops: list = [Send(right, DATA, seq, acc[lo:min(ohi, lo + step)].data)
                     for lo in range(olo, ohi, step)]
        for lo in range(ilo, ihi, step):
            hi = min(ihi, lo + step)
            piece = tmp[lo - ilo:hi - ilo]
            ops.append(Recv(left, DATA, seq, piece.data,
                            then=_reducer(ufunc, piece, acc[lo:hi])))
        transfer(g.name, ops, g.deadline())


def _reducer(ufunc: Any, piece: np.ndarray, into: np.ndarray) -> Any:
    return lambda: ufunc(piece, into, out=into)


def _all_gather(g: Any, acc: np.ndarray, bounds: list, seq: int) -> None:
    """Each member's reduced chunk (``_reduce_scatter``) to every member."""
    n, r = g.world, g.rank
    right, left = _neighbours(g)
    for s in range(n - 1):
        out_c = (r - s) % n
        in_c = (r - s - 1) % n
        olo, ohi = bounds[out_c]
        ilo, ihi = bounds[in_c]
        transfer(g.name, [Send(right, DATA, seq, acc[olo:ohi].data),
                          Recv(left, DATA, seq, acc[ilo:ihi].data)], g.deadline())


def broadcast(g: Any, arr: Optional[np.ndarray], root: int, dtype: str, shape: tuple,
              seq: int) -> np.ndarray:
    if g.rank == root:
        assert arr is not None
        transfer(g.name, [Send(link, DATA, seq, _flat(arr).data)
                          for link in g.links.values()], g.deadline())
        return arr.copy()
    out = np.empty(shape, dtype=np.dtype(dtype))
    transfer(g.name, [Recv(g.links[root], DATA, seq, _flat(out).data)],
             g.deadline())
    return out


def allgather(g: Any, arr: np.ndarray, metas: list, seq: int) -> list:
    ops: list = []
    outs: list = []
    for r in range(g.world):
        if r == g.rank:
            outs.append(arr.copy())
            continue
        dtype, shape = metas[r]
        out = np.empty(shape, dtype=np.dtype(dtype))
        outs.append(out)
        link = g.links[r]
        ops.append(Send(link, DATA, seq, _flat(arr).data))
        ops.append(Recv(link, DATA, seq, _flat(out).data))
    transfer(g.name, ops, g.deadline())
    return outs
