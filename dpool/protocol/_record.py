"""``@record``: a class as ``@dataclass`` makes it, for less at import time.

Every dpool program creates the wire messages and a few records (a worker group, its
configuration, a task-table row) when it imports the runtime. ``dataclasses`` compiles
three methods per class when the class is created, a large part of a short program's
start-up (figures: bench/NOTES.md).

A ``@record`` class has what ``@dataclass`` (``eq=True``, not frozen) gives it --
``__init__`` with the fields positional in order (defaults and
``field(default_factory=...)`` kept), ``__repr__``, ``__eq__`` (same class, tuples of
fields equal), ``__hash__ = None``, ``__match_args__``, and with ``slots=True``
``__slots__`` in field order -- but ``__init__`` is compiled when the class is first
instantiated (``_first_init``), and ``__repr__`` and ``__eq__`` are shared by all.
``class M(Slotted)`` is ``@record(slots=True) class M``, made in one class creation
instead of two (the decorator gets a finished class and must make it again to give it
``__slots__``): the wire messages, 55 classes, use it.
Type checkers see a dataclass (``dataclass_transform``). Not provided: the
``dataclasses`` module's functions (``fields``, ``asdict``, ``replace``) on them.
``field`` is this module's own (``default`` or ``default_factory``), so that nothing on
the runtime's import path loads ``dataclasses`` (and ``inspect``, ``ast``, ``dis`` with
it).
"""

from __future__ import annotations

import sys
import types
from reprlib import recursive_repr

__all__ = ["Slotted", "field", "record"]

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TypeVar, dataclass_transform

    _C = TypeVar("_C", bound=type)
else:
    def dataclass_transform(**_: object) -> Callable:
        """typing's decorator, which only tells type checkers what ``record`` makes."""
        return lambda obj: obj


class _FactoryMarker:
    def __repr__(self) -> str:
        return "<factory>"  # what a dataclass's signature shows for it


_FACTORY = _FactoryMarker()


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class Field:
    """What :func:`field` returns, in a class body: a default or a default factory."""

    __slots__ = ("default", "default_factory")

    def __init__(self, default: Any, default_factory: Any) -> None:
        self.default = default
        self.default_factory = default_factory


def field(*, default: Any = MISSING, default_factory: Any = MISSING) -> Any:
    """A field's default, or a callable that makes a fresh one for each instance."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory)


@dataclass_transform(field_specifiers=(field, Field))
def record(cls: Optional[_C] = None, /, *, slots: bool = False, init: bool = True) -> Any:
    """``@record``, ``@record(slots=True)``: see the module docstring. ``init=False``
    (as a dataclass's): the class's own ``__init__`` is kept -- a record of many fields
    or default factories that a program makes once or twice (a worker group, a worker's
    configuration) writes its own, which is compiled with its module instead of at run
    time (~0.9-1.8 M instructions each, in every process that made one)."""
    if cls is None:
        return lambda c: _make(c, slots, init)
    return _make(cls, slots, init)


def _fields(body: Any) -> tuple[tuple[str, ...], dict[str, Any], dict[str, Callable[[], Any]]]:
    """(field names, {field: default}, {field: default factory}) of a class body."""
    names = tuple(name for name, kind in body.get("__annotations__", {}).items()
                  if not str(kind).startswith("ClassVar"))
    defaults: dict[str, Any] = {}
    factories: dict[str, Callable[[], Any]] = {}
    for n in names:
        value = body.get(n, MISSING)
        if isinstance(value, Field):
            if value.default_factory is not MISSING:
                factories[n] = value.default_factory
            elif value.default is not MISSING:
                defaults[n] = value.default
        elif value is not MISSING:
            defaults[n] = value
    return names, defaults, factories


def _methods(names: tuple[str, ...]) -> dict[str, Any]:
    return dict(__match_args__=names, __init__=_first_init, __repr__=_repr, __eq__=_eq,
                __hash__=None)


class _SlottedMeta(type):
    """Makes a subclass of :class:`Slotted` what ``@record(slots=True)`` makes of a class,
    in one class creation (the decorator gets a class already made, and must make it
    again to give it ``__slots__``)."""

    def __new__(mcls, name: str, bases: tuple, body: dict) -> Any:
        if not any(isinstance(b, _SlottedMeta) for b in bases):  # Slotted itself
            return super().__new__(mcls, name, bases, body)
        names, defaults, factories = _fields(body)
        ns = {k: v for k, v in body.items() if k not in names}
        ns.update(_methods(names), __slots__=names)
        cls = super().__new__(mcls, name, bases, ns)
        _SPECS[cls] = (names, defaults, factories)
        return cls


@dataclass_transform(field_specifiers=(field, Field))
class Slotted(metaclass=_SlottedMeta):
    """Base of a record with ``__slots__`` (the wire messages): ``class M(Slotted)`` is
    ``@record(slots=True) class M``, made once. Its fields are its own annotations (a
    subclass of a Slotted subclass is not supported)."""

    __slots__ = ()


def _make(cls: _C, slots: bool, init: bool = True) -> _C:
    body = cls.__dict__
    names, defaults, factories = _fields(body)
    methods = _methods(names)
    if not init:
        del methods["__init__"]
    if slots:
        ns = {k: v for k, v in body.items()
              if k not in names and k not in ("__dict__", "__weakref__")}
        ns.update(methods, __slots__=names, __qualname__=cls.__qualname__)
        cls = type(cls)(cls.__name__, cls.__bases__, ns)
    else:
        for k, v in methods.items():
            setattr(cls, k, v)
        for n in names:  # as a dataclass: a plain default stays a class attribute
            if n in defaults:
                setattr(cls, n, defaults[n])
            elif n in body:
                delattr(cls, n)
    _SPECS[cls] = (names, defaults, factories)
    return cls


# class -> (field names, {field: default}, {field: default factory})
_SPECS: dict[type, tuple[tuple[str, ...], dict[str, Any], dict[str, Callable[[], Any]]]] = {}


def _make_init(cls: type) -> Callable[..., None]:
    names, defaults, factories = _SPECS[cls]
    if not factories and len(names) < len(_TEMPLATES):
        init = _from_template(names, tuple(defaults[n] for n in names if n in defaults),
                              f"{cls.__qualname__}.__init__")
    else:
        init = _compiled_init(names, defaults, factories)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    annotations = cls.__annotations__
    init.__annotations__ = {n: annotations[n] for n in names} | {"return": None}
    return init


# ``__init__`` of a record without default factories: the template of its number of
# fields, compiled with this module, with the field names put in (``code.replace``) and
# the defaults as the function's -- what ``_compiled_init`` would make, without compiling
# source at run time (~0.4 M instructions a class, in every process that makes one).
def _t0(self):  # type: ignore[no-untyped-def]
    pass


def _t1(self, f0):  # type: ignore[no-untyped-def]
    self.f0 = f0


def _t2(self, f0, f1):  # type: ignore[no-untyped-def]
    self.f0 = f0
    self.f1 = f1


def _t3(self, f0, f1, f2):  # type: ignore[no-untyped-def]
    self.f0 = f0
    self.f1 = f1
    self.f2 = f2


def _t4(self, f0, f1, f2, f3):  # type: ignore[no-untyped-def]
    self.f0 = f0
    self.f1 = f1
    self.f2 = f2
    self.f3 = f3


def _t5(self, f0, f1, f2, f3, f4):  # type: ignore[no-untyped-def]
    self.f0 = f0
    self.f1 = f1
    self.f2 = f2
    self.f3 = f3
    self.f4 = f4


def _t6(self, f0, f1, f2, f3, f4, f5):  # type: ignore[no-untyped-def]
    self.f0 = f0
    self.f1 = f1
    self.f2 = f2
    self.f3 = f3
    self.f4 = f4
    self.f5 = f5


def _t7(self, f0, f1, f2, f3, f4, f5, f6):  # type: ignore[no-untyped-def]
    self.f0 = f0
    self.f1 = f1
    self.f2 = f2
    self.f3 = f3
    self.f4 = f4
    self.f5 = f5
    self.f6 = f6


def _t8(self, f0, f1, f2, f3, f4, f5, f6, f7):  # type: ignore[no-untyped-def]
    self.f0 = f0
    self.f1 = f1
    self.f2 = f2
    self.f3 = f3
    self.f4 = f4
    self.f5 = f5
    self.f6 = f6
    self.f7 = f7


_TEMPLATES = (_t0, _t1, _t2, _t3, _t4, _t5, _t6, _t7, _t8)


def _from_template(names: tuple[str, ...], defaults: tuple,
                   qualname: str) -> Callable[..., None]:
    code = _TEMPLATES[len(names)].__code__
    if names:  # the template's stores (co_names) and arguments, in field order
        code = code.replace(co_names=names, co_varnames=("self",) + names)
    code = code.replace(co_name="__init__")
    if hasattr(code, "co_qualname"):  # 3.11+: tracebacks name Class.__init__
        code = code.replace(co_qualname=qualname)
    return types.FunctionType(code, {}, "__init__", defaults or None)


def _compiled_init(names: tuple[str, ...], defaults: dict[str, Any],
                   factories: dict[str, Callable[[], Any]]) -> Callable[..., None]:
    params = ["self"]
    lines = []
    scope: dict[str, Any] = {"_FACTORY": _FACTORY}
    for n in names:
        if n in factories:
            params.append(f"{n}=_FACTORY")
            scope[f"_f_{n}"] = factories[n]
            lines.append(f"    self.{n} = _f_{n}() if {n} is _FACTORY else {n}")
        else:
            if n in defaults:
                params.append(f"{n}=_d_{n}")
                scope[f"_d_{n}"] = defaults[n]
            else:
                params.append(n)
            lines.append(f"    self.{n} = {n}")
    source = f"def __init__({', '.join(params)}):\n" + ("\n".join(lines) or "    pass")
    exec(source, scope)  # noqa: S102 - as dataclasses does
    return scope["__init__"]  # type: ignore[no-any-return]


def _first_init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    while cls not in _SPECS:  # a subclass that is no record itself: its record base's
        cls = cls.__mro__[1]
    cls.__init__ = _make_init(cls)  # type: ignore[misc] # later instances go straight to it
    cls.__init__(self, *args, **kwargs)


@recursive_repr()
def _repr(self: Any) -> str:
    fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__match_args__)
    return f"{self.__class__.__qualname__}({fields})"


if sys.version_info >= (3, 13):
    def _eq(self: Any, other: Any) -> Any:
        """3.13's dataclass: field by field, ``a == a2 and b == b2 ...`` (so a NaN field
        makes two records unequal even when it is the same object)."""
        if other.__class__ is self.__class__:
            same: Any = True
            for n in self.__match_args__:
                same = getattr(self, n) == getattr(other, n)
                if not same:
                    return same
            return same
        return NotImplemented
else:
    def _eq(self: Any, other: Any) -> Any:
        """Before 3.13, dataclass compares tuples of fields (identity first, as tuples do)."""
        if other.__class__ is self.__class__:
            names = self.__match_args__
            return tuple(getattr(self, n) for n in names) == \
                tuple(getattr(other, n) for n in names)
        return NotImplemented
