"""``python -m dpool <command>``: dpool's command line (see ``dpool.cli``)."""

import sys

from dpool.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
