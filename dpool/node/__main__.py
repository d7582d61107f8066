"""``python -m dpool.node ...``: run a node daemon (``dpool start`` does this for you)."""

import sys

from dpool.node._daemon import main

sys.exit(main())
