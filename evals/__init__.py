"""Tasuki's evals (issue 39): run a task set's rows as real tasks through the fleet, grade them, report.

Above the worker, below the console and the CLI: ``evals`` may import ``worker``; nothing below imports ``evals``.
"""
