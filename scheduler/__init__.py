"""The scheduler (SPEC §7): the beat schedule and what it runs.

``beat`` sends the schedule from exactly one beat process; ``plan`` decides and ``monitor`` observes and acts on
lost tasks and interrupted completions; ``alerts`` measures the store; ``jobs`` holds the functions the
``tasuki reap / retention / alerts`` commands and the Celery tasks of ``tasks`` share.
"""
