"""Per-task resources: what a task asks for (``Request``), what it holds (``Allocation``) and
what a runtime or node has left to give (``Ledger``).

A request names CPUs, GPUs, bytes of memory, custom resources (any name: ``"TPU"``,
``"license"``) and, in wire form, a scheduling strategy or a bundle. The default -- one
CPU, nothing else -- is no request at all (``None``): such tasks never take the resource
path, so the ordinary dispatch path pays nothing for it.

GPUs are counted per device. A request below one GPU (``0.25``) is a share of a single
device, and shares pack onto the device that is already most used; a request of one or
more must be whole and gets that many devices to itself. Devices an idle worker is bound
to are taken first (``acquire``'s ``prefer``). Shares are kept in integer units
(``GPU_UNIT`` per device) so that four quarter-GPU tasks add up to exactly one.

CPUs are not in the ledger: on the embedded runtime they are each executor's
``max_workers``, on a node its ``cpu_limit``; the local scheduler counts them where it
counts busy workers. GPUs, memory and custom resources are shared by every executor of
the runtime (or node) and live here.

No processes, no locks, no imports of the scheduler: ``Ledger`` is used under the
scheduler's lock; the request functions (``spec``, ``build``, ``mark``...) are called from
any thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from operator import itemgetter

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Iterable, Optional

GPU_UNIT = 10_000  # a device's share, in units (1/10000 of a GPU is the finest request)


class _Fields(tuple):
    """A named tuple's behaviour for the two below, without ``collections.namedtuple``,
    whose class factory every program would run at import for classes only a resource
    request uses (bench/COLDSTART.md): fields by name, ``_replace``, the repr, and
    pickling by value as ``cls(*fields)``."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _replace(self, **changes: Any) -> Any:
        return type(self)(**{**dict(zip(self._fields, self, strict=True)), **changes})

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(self._fields, self, strict=True))
        return f"{type(self).__name__}({shown})"

    def __getnewargs__(self) -> tuple:
        return tuple(self)


class Request(_Fields):
    """A task's needs. Travels on the wire as a plain tuple (``tuple(req)``).

    - ``cpus`` (int, 1), ``gpus`` (float, 0.0), ``memory`` (int bytes, 0);
    - ``custom``: ``((name, amount), ...)`` sorted by name, amounts > 0;
    - ``strategy``: where it asks to run, in wire form
      (``placement.strategy_to_wire``): None for the default rule. A task that
      asks only for a strategy is a request too, so the ordinary dispatch path never
      looks at strategies.
    - ``limits``: ``(timeout_s, retry_on_timeout)`` of ``options(timeout=)``, or None;
      taken off the request when the scheduler admits the task (``_limits``).
    """

    __slots__ = ()
    _fields = ("cpus", "gpus", "memory", "custom", "strategy", "limits")

    def __new__(cls, cpus: int = 1, gpus: float = 0.0, memory: int = 0, custom: tuple = (),
                strategy: Any = None, limits: Optional[tuple] = None) -> Request:
        return tuple.__new__(cls, (cpus, gpus, memory, custom, strategy, limits))

    cpus = property(itemgetter(0))
    gpus = property(itemgetter(1))
    memory = property(itemgetter(2))
    custom = property(itemgetter(3))
    strategy = property(itemgetter(4))
    limits = property(itemgetter(5))

    def as_dict(self) -> dict:
        """``{"CPU": .., "GPU": .., "memory": .., name: ..}`` without zero entries but CPU."""
        d: dict = {"CPU": self.cpus}
        if self.gpus:
            d["GPU"] = self.gpus
        if self.memory:
            d["memory"] = self.memory
        d.update(self.custom)
        return d

    def __str__(self) -> str:
        return _describe(self.as_dict())


def _describe(d: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {_num(v)}" for k, v in d.items()) + "}"


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _number(name: str, value: Any) -> float:
    import numbers  # here: only a resource request reads it

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    v = float(value)
    if math.isnan(v) or math.isinf(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def spec(num_cpus: Any = None, num_gpus: Any = None, memory: Any = None,
         resources: Optional[Mapping[str, Any]] = None) -> dict:
    """A validated partial request: ``{"CPU": .., "GPU": .., "memory": .., name: ..}``
    with only the entries given. Raises ``TypeError``/``ValueError`` saying which."""
    out: dict = {}
    if resources is not None:
        if not isinstance(resources, Mapping):
            raise TypeError("resources must be a mapping of resource name to amount, "
                            f"got {type(resources).__name__}")
        for name, amount in resources.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"resource names must be non-empty strings, got {name!r}")
            out[name] = amount
    for name, value in (("CPU", num_cpus), ("GPU", num_gpus), ("memory", memory)):
        if value is not None:
            out[name] = value
    for name in list(out):
        label = {"CPU": "num_cpus", "GPU": "num_gpus"}.get(name, name)
        if name not in ("CPU", "GPU", "memory") and resources is not None:
            label = f"resources[{name!r}]"
        v = _number(label, out[name])
        if name == "CPU" or name == "memory":
            if v != int(v):
                raise ValueError(f"{label} must be a whole number, got {out[name]!r}")
            out[name] = int(v)
        elif name == "GPU":
            if v > 1 and v != int(v):
                raise ValueError(f"num_gpus above 1 must be a whole number (a share of one "
                                 f"GPU is below 1), got {out[name]!r}")
            if 0 < v < 1 and round(v * GPU_UNIT) == 0:
                raise ValueError(f"num_gpus {out[name]!r} is below the finest share "
                                 f"(1/{GPU_UNIT} of a GPU)")
            out[name] = v
        else:
            out[name] = v
    return out


# A spec's entry for the strategy (``scheduling=``): not a str, so no resource name
# a user gives (``spec`` accepts only str names) can collide with it.
STRATEGY = ("scheduling",)
LIMITS = ("limits",)  # a spec's key for ``options(timeout=)``: (timeout_s, retry_on_timeout)
# Wire forms of strategies that the local scheduler reads on every task with a request
# (``dpool.placement`` loads only when a task asks where to run; it declares the same):
BUNDLE = "bundle"  # (BUNDLE, pg_id, index): run in a placement group's bundle
# "placed: run on this node, never spill it" (a task whose strategy was honoured -- a
# global scheduler chose its origin, or it names its own node). Only a node sets it, on
# its own tasks; it never travels.
HERE: tuple = ("here",)


def with_strategy(s: Optional[Mapping[str, Any]], scheduling: Any) -> dict:
    """Spec ``s`` asking for the placement strategy ``scheduling`` (``"default"``,
    ``"spread"``, a ``NodeAffinity``), validated: ``ValueError``/``TypeError`` saying
    what is accepted. ``"default"`` is kept, so that it overrides an executor's."""
    from dpool.placement import strategy_to_wire, validate_strategy

    out: dict = dict(s or {})
    out[STRATEGY] = strategy_to_wire(validate_strategy(scheduling))
    return out


def in_bundle(s: Optional[Mapping[str, Any]], where: Any) -> dict:
    """Spec ``s`` run in a placement group's bundle (``where``: a validated
    ``placement.InBundle``)."""
    from dpool.placement import strategy_to_wire

    out: dict = dict(s or {})
    out[STRATEGY] = strategy_to_wire(where)
    return out


def build(*specs: Optional[Mapping[Any, Any]]) -> Optional[Request]:
    """The request of validated partial specs merged left to right (later ones win per
    resource); ``None`` when that is the default (one CPU, nothing else)."""
    merged: dict = {}
    for s in specs:
        if s:
            merged.update(s)
    if not merged:
        return None
    strategy = merged.pop(STRATEGY, None)
    limits = merged.pop(LIMITS, None)
    cpus = merged.pop("CPU", 1)
    gpus = float(merged.pop("GPU", 0.0))
    memory = merged.pop("memory", 0)
    custom = tuple(sorted((k, float(v)) for k, v in merged.items() if v))
    if cpus == 1 and not gpus and not memory and not custom and strategy is None \
            and limits is None:
        return None
    return Request(cpus, gpus, memory, custom, strategy, limits)


def from_wire(t: Optional[tuple]) -> Optional[Request]:
    if t is None:
        return None
    custom = tuple(tuple(x) for x in t[3])
    limits = tuple(t[5]) if len(t) > 5 and t[5] is not None else None
    if len(t) > 4 and t[4] is not None:  # a strategy (``to_wire`` sends 4 fields without)
        return Request(t[0], t[1], t[2], custom, tuple(t[4]), limits)
    return Request(t[0], t[1], t[2], custom, None, limits)


def to_wire(r: Optional[Request]) -> Optional[tuple]:
    if r is None:
        return None
    if r.limits is not None:
        return (r.cpus, r.gpus, r.memory, r.custom, r.strategy, r.limits)
    if r.strategy is None:
        return (r.cpus, r.gpus, r.memory, r.custom)
    return (r.cpus, r.gpus, r.memory, r.custom, r.strategy)


# -- functions that declare their needs (``@dpool.resources``) -----------------------------
ATTR = "__dpool_resources__"
decorated = False  # no function was ever decorated: submit skips the lookup entirely


def mark(fn: Any, s: dict) -> Any:
    global decorated
    try:
        setattr(fn, ATTR, s)
    except (AttributeError, TypeError) as exc:
        raise TypeError(f"@dpool.resources cannot annotate {fn!r} (no attributes can be "
                        "set on it); use executor.options(...) instead") from exc
    decorated = True
    return fn


def of_function(fn: Any) -> Optional[dict]:
    return getattr(fn, ATTR, None)


# -- what a runtime or node has ------------------------------------------------------------
class Allocation(_Fields):
    """What a ``Request`` took: ``gpu_ids``, device indexes (into ``Ledger.gpu_names``),
    and ``gpu_units``, the units taken from each of them."""

    __slots__ = ()
    _fields = ("request", "gpu_ids", "gpu_units")

    def __new__(cls, request: Request, gpu_ids: tuple, gpu_units: Any) -> Allocation:
        return tuple.__new__(cls, (request, gpu_ids, gpu_units))

    request = property(itemgetter(0))
    gpu_ids = property(itemgetter(1))
    gpu_units = property(itemgetter(2))


class Ledger:
    """Capacity and free amounts of GPUs, memory and custom resources of one runtime or
    node; per GPU, the units still free."""

    def __init__(self, gpu_names: Iterable[str] = (), memory: int = 0,
                 custom: Optional[Mapping[str, float]] = None) -> None:
        self.gpu_names = [str(n) for n in gpu_names]
        self.gpu_free = [GPU_UNIT] * len(self.gpu_names)
        self.memory = int(memory)
        self.memory_free = self.memory
        self.custom = {k: float(v) for k, v in (custom or {}).items() if v}
        self.custom_free = dict(self.custom)
        self.held = 0  # allocations not yet released

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_names)

    def offer(self, cpus: Optional[int] = None) -> dict:
        """What it has in all, as users name it (for messages and status)."""
        d: dict = {} if cpus is None else {"CPU": cpus}
        d["GPU"] = self.num_gpus
        if self.memory:
            d["memory"] = self.memory
        d.update(self.custom)
        return d

    def shortfall(self, r: Request) -> Optional[str]:
        """Why ``r`` can never be met here, whatever is released (None: it can)."""
        missing = []
        if r.gpus > self.num_gpus:
            missing.append(f"GPU: {_num(r.gpus)} asked, {self.num_gpus} here")
        if r.memory > self.memory:
            missing.append(f"memory: {r.memory} bytes asked, {self.memory} here")
        for name, amount in r.custom:
            have = self.custom.get(name, 0.0)
            if amount > have + 1e-9:
                missing.append(f"{name}: {_num(amount)} asked, {_num(have)} here"
                               if have else f"{name}: unknown here")
        return "; ".join(missing) or None

    def acquire(self, r: Request, prefer: Iterable[tuple] = ()) -> Optional[Allocation]:
        """Take what ``r`` needs if all of it is free now (else None, nothing taken).
        ``prefer``: GPU id sets with an idle worker bound to them, tried first."""
        if r.memory > self.memory_free:
            return None
        for name, amount in r.custom:
            if amount > self.custom_free.get(name, 0.0) + 1e-9:
                return None
        ids: tuple = ()
        units = 0
        if r.gpus:
            ids, units = self._gpus(r.gpus, prefer)
            if not ids:
                return None
            for i in ids:
                self.gpu_free[i] -= units
        self.memory_free -= r.memory
        for name, amount in r.custom:
            self.custom_free[name] -= amount
        self.held += 1
        return Allocation(r, ids, units)

    def _gpus(self, gpus: float, prefer: Iterable[tuple]) -> tuple[tuple, int]:
        free = self.gpu_free
        prefer = [ids for ids in prefer if all(i < len(free) for i in ids)]
        if gpus < 1:
            units = max(1, round(gpus * GPU_UNIT))
            for ids in prefer:
                if len(ids) == 1 and free[ids[0]] >= units:
                    return ids, units
            # pack: the most used device that still has room
            fits = [i for i, f in enumerate(free) if f >= units]
            if not fits:
                return (), 0
            return (min(fits, key=lambda i: (free[i], i)),), units
        n = int(gpus)
        for ids in prefer:
            if len(ids) == n and all(free[i] == GPU_UNIT for i in ids):
                return ids, GPU_UNIT
        whole = [i for i, f in enumerate(free) if f == GPU_UNIT]
        if len(whole) < n:
            return (), 0
        return tuple(whole[:n]), GPU_UNIT

    def release(self, a: Allocation) -> None:
        for i in a.gpu_ids:
            self.gpu_free[i] += a.gpu_units
        self.memory_free += a.request.memory
        for name, amount in a.request.custom:
            self.custom_free[name] += amount
        self.held -= 1

    def held_gpus(self) -> frozenset:
        """Device indexes some task holds (a share or whole)."""
        return frozenset(i for i, f in enumerate(self.gpu_free) if f < GPU_UNIT)

    def names(self, ids: Iterable[int]) -> str:
        """``CUDA_VISIBLE_DEVICES`` for these device indexes."""
        return ",".join(self.gpu_names[i] for i in ids)
