"""dpool's pytest plugin: ``pytest -n auto --dpool`` runs pytest-xdist's test workers on dpool.

``_plugin`` is what pytest loads on every run (the ``pytest11`` entry point ``dpool``); it
imports nothing but pytest until ``--dpool`` is given. The rest -- the controller side
(``_controller``), the task each test worker runs in (``_task``), the bridge process
execnet starts (``_bridge``) and the worker-side wrapper of xdist's remote module
(``_remote``) -- loads only then. See ``_controller`` for how the pieces fit.
"""

# Nothing here is for other packages: pytest loads the plugin through its entry point
# (``dpool.testing._plugin``).
__all__: list[str] = []
