"""``python -m dpool.autoscaler ...`` (``dpool start --head --autoscale`` runs it for you)."""

import sys

from dpool.autoscaler._daemon import main

sys.exit(main())
