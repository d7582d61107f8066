"""``python -m dpool <command>``: dpool's command line.

Commands:
    run script.py [args...]   run an unmodified program with the stdlib's process pools
                              bound to dpool's (see ``dpool._run``)
    run -m module [args...]   the same for ``python -m module``
"""

from __future__ import annotations

import sys

_USAGE = """usage: python -m dpool <command> [args...]

commands:
  run script.py [args...]   run a program unchanged, on dpool's pools
  run -m module [args...]   run a module unchanged, on dpool's pools
"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "run":
        from dpool import _run

        return _run.main(rest)
    sys.stderr.write(f"python -m dpool: unknown command {command!r}\n\n{_USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
