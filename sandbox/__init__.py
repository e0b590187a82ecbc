"""Where the agent's commands run, and the repository environment they run in (SPEC §17).

A room below the worker: it imports ``contexts`` and nothing of Celery, Redis, the worker or a database driver.
"""
