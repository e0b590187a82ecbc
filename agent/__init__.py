"""The agent (SPEC §5): the loop, its tools, prompts and model providers.

It runs one task over a held context, a checkout and a sandbox, and knows nothing of Celery, Redis or a
database: the worker hands it a checkout, a meter and a stop signal (:mod:`agent.seams`).
"""
