"""This process's connection to its host's runtime: start or attach, current runtime.

In a driver, the runtime (local scheduler, control store, later the object store) starts
on first use. In a worker, the "runtime" is the worker's client of its scheduler, so task
code that submits, waits or gets talks to the scheduler that runs it.
"""
