"""Many hosts (SPEC §12): the fleet's store in PostgreSQL — ownership leases with a fencing token and the durable
copy of every context. A room below the worker, beside memory: it imports contexts, memory and the database driver,
never the worker, Celery or Redis. One host (``fleet.store`` unset) never imports it."""
