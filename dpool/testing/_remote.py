"""xdist's worker module (``xdist.remote``), run after mapping the controller's paths.

pytest-xdist sends its worker the controller's command-line arguments and ``sys.path``
and lets the worker find its rootdir from them, as on the controller -- right when the
worker runs in the controller's directory. Under ``--dpool`` on a cluster the worker
may run on another node, in the shipped copy of the controller's rootdir
(``$DPOOL_XDIST_ROOT``). The plugin returns this module from
``pytest_xdist_getremotemodule``; execnet runs its source in the worker (as
``__channelexec__``, so it is self-contained): it takes xdist's first message, maps every
path under the controller's rootdir into the copy (arguments, ``sys.path``), keeps the
worker's own ``sys.path`` entries after the controller's (the node's site-packages may
live elsewhere), makes sure ``--basetemp``'s parent exists there, and then runs
``xdist.remote``'s own source unchanged, handing it the mapped message. Where the copy
is the directory itself (the embedded runtime, a node on the controller's host) it
changes nothing.
"""

if __name__ == "__channelexec__":
    import importlib.util
    import os
    import sys

    class _Replayed:
        """xdist's channel, whose first ``receive()`` returns the mapped first message."""

        def __init__(self, channel, first):
            self._channel = channel
            self._first = [first]

        def receive(self, timeout=None):
            if self._first:
                return self._first.pop()
            return self._channel.receive(timeout)

        def __getattr__(self, name):
            return getattr(self._channel, name)

    _real = channel  # type: ignore[name-defined] # noqa: F821 - given by execnet
    workerinput, args, option_dict, change_sys_path = _real.receive()
    _root = (workerinput.get("dpool_xdist") or {}).get("root")
    _here = os.environ.get("DPOOL_XDIST_ROOT")
    if _root and _here and _root != _here:
        _prefix = _root.rstrip(os.sep) + os.sep

        def _map(path):
            if path == _root:
                return _here
            if isinstance(path, str) and path.startswith(_prefix):
                return os.path.join(_here, path[len(_prefix):])
            return path

        def _map_arg(arg):
            if arg.startswith("--") and "=" in arg:
                key, value = arg.split("=", 1)
                return key + "=" + _map(value)
            return _map(arg)

        args = [_map_arg(a) for a in args]
        if change_sys_path is not None:
            _mapped = [_map(p) for p in change_sys_path]
            change_sys_path = _mapped + [p for p in sys.path if p not in _mapped]
    _basetemp = option_dict.get("basetemp")
    if _basetemp:
        os.makedirs(os.path.dirname(_basetemp), mode=0o700, exist_ok=True)
    # (the package's spec, not ``xdist.remote``'s: that would import ``xdist`` before
    # pytest can rewrite its asserts, and pytest would warn about it)
    _spec = importlib.util.find_spec("xdist")
    assert _spec is not None and _spec.origin is not None  # xdist's controller started us
    _origin = os.path.join(os.path.dirname(_spec.origin), "remote.py")
    with open(_origin, encoding="utf-8") as _f:
        _source = _f.read()
    exec(compile(_source, _origin, "exec"), {  # noqa: S102 - xdist's own worker code
        "__name__": "__channelexec__",
        "__file__": _origin,
        "channel": _Replayed(_real, (workerinput, args, option_dict, change_sys_path)),
    })
