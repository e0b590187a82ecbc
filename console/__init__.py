"""The operators' web console (SPEC §15): the fleet, the tasks and each task's context in a browser, live.

It reads the context store, its index and Redis, and cancels through the worker's cancel; the intake's app
mounts it under ``/console/`` and ``tasuki console`` serves it alone.
"""
