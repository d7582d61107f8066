"""``python -m dpool.global_scheduler ...`` (``dpool start --head`` runs it for you)."""

import sys

from dpool.global_scheduler._daemon import main

sys.exit(main())
