"""dpool's loggers, without importing ``logging`` until a record could be emitted.

``logging`` (with ``string``, ``weakref`` and the rest it brings) costs a short program
more than dpool's own first task, and ``multiprocessing.Pool``'s programs never load it.
A :class:`Logger` here stands for ``logging.getLogger(name)``:

- DEBUG and INFO records are dropped while ``logging`` is not imported. Nothing can have
  configured logging then, and unconfigured, every logger's effective level is the root's
  WARNING: ``logging`` itself would drop them. Once any code imports ``logging``, every
  call goes to the real logger (a program that sets up logging later sees dpool's debug
  records from then on, as before);
- WARNING and above import ``logging`` and go to the real logger (unconfigured, its last
  resort handler prints them to stderr, as ever).

Records name the caller's file, function and line, not this module's (``stacklevel``).
"""

from __future__ import annotations

import sys

__all__ = ["Logger", "getLogger"]

_loggers: dict[str, Logger] = {}


class Logger:
    """``logging.getLogger(name)``, loaded when first needed (see the module docstring)."""

    __slots__ = ("name", "_real")

    def __init__(self, name: str) -> None:
        self.name = name
        self._real = None

    def logger(self):  # -> logging.Logger
        real = self._real
        if real is None:
            import logging

            real = self._real = logging.getLogger(self.name)
        return real

    def debug(self, msg: object, *args: object, **kwargs: object) -> None:
        if "logging" in sys.modules:
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # type: ignore[operator]
            self.logger().debug(msg, *args, **kwargs)

    def info(self, msg: object, *args: object, **kwargs: object) -> None:
        if "logging" in sys.modules:
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # type: ignore[operator]
            self.logger().info(msg, *args, **kwargs)

    def warning(self, msg: object, *args: object, **kwargs: object) -> None:
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # type: ignore[operator]
        self.logger().warning(msg, *args, **kwargs)

    def error(self, msg: object, *args: object, **kwargs: object) -> None:
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # type: ignore[operator]
        self.logger().error(msg, *args, **kwargs)

    def exception(self, msg: object, *args: object, **kwargs: object) -> None:
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # type: ignore[operator]
        kwargs.setdefault("exc_info", True)
        self.logger().error(msg, *args, **kwargs)

    def critical(self, msg: object, *args: object, **kwargs: object) -> None:
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # type: ignore[operator]
        self.logger().critical(msg, *args, **kwargs)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging's name
        if level < 30 and "logging" not in sys.modules:  # below WARNING: see above
            return False
        return self.logger().isEnabledFor(level)

    def __repr__(self) -> str:
        return f"<dpool logger {self.name!r}>"


def getLogger(name: str) -> Logger:  # noqa: N802 - logging's name
    """The lazy stand-in for ``logging.getLogger(name)`` (one per name)."""
    lg = _loggers.get(name)
    if lg is None:
        lg = _loggers[name] = Logger(name)
    return lg
