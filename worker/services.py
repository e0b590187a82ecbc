"""A task's services around its agent loop (SPEC §17): declared by the repository or the operator, started once
the checkout and its environment are ready, stopped when the loop ends, however it ends (sandbox/services.py)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import structlog

from sandbox.services import ServicesError, declared_services, task_services
from worker.checkout import Checkout
from worker.settings_models import Settings

log = structlog.get_logger(__name__)


def services_for(checkout: Checkout, repository: str, settings: Settings) -> AbstractContextManager[str]:
    """The task's services for the block; it yields what the agent's first message says about them. A declaration
    that cannot be read starts none: the task goes on and the agent is told why."""
    try:
        declared = declared_services(checkout.path, repository, settings.environments)
    except ServicesError as exc:
        log.warning("services not started", error=str(exc))
        return nullcontext(f"No services were started for this task: {exc}")
    return task_services(declared, settings.sandbox, checkout.path, checkout.home)
