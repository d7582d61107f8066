"""A package's front door whose names load on first use (PEP 562).

A package lists what other packages may use in ``__all__`` and says where each name
lives: ``lazy`` maps a name to the module that defines it, ``modules`` a name to a module
exported whole as a namespace (``from dpool.objects import payload as _payload``).
``front_door`` gives the package its module ``__getattr__`` and ``__dir__``: a name is
imported the first time it is asked for, then kept in the package's namespace, so
importing the package loads none of its modules and a second lookup costs nothing.
"""

import sys  # (no ``from __future__`` import: importing a package loads nothing more)

TYPE_CHECKING = False  # typing's, without importing typing (type checkers know it)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def front_door(package: str, lazy: "Mapping[str, str]",
               modules: "Mapping[str, str] | None" = None,
               ) -> "tuple[Callable[[str], object], Callable[[], list]]":
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``)."""
    modules = modules or {}

    def __getattr__(name: str) -> object:
        import importlib

        if name in modules:
            value = importlib.import_module(modules[name])
        elif name in lazy:
            value = getattr(importlib.import_module(lazy[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list:
        return sorted({*vars(sys.modules[package]), *modules, *lazy})

    return __getattr__, __dir__
