"""Every Celery queue, task name and Redis key prefix Tasuki uses, defined once (SPEC §5, §7, §8)."""

from __future__ import annotations

from typing import Final

# Queues
TASKS_QUEUE: Final = "tasks"
COMPRESSION_QUEUE: Final = "compression"
MAINTENANCE_QUEUE: Final = "maintenance"
QUEUES: Final = (TASKS_QUEUE, COMPRESSION_QUEUE, MAINTENANCE_QUEUE)

# Task names (stable across refactors: queued messages and Flower refer to them)
RUN_TASK: Final = "tasuki.run_task"
COMPRESS_CONTEXT: Final = "tasuki.compress_context"
REAP_STALE: Final = "tasuki.reap_stale"
RETENTION: Final = "tasuki.retention"
PICK_ATTEMPTS: Final = "tasuki.pick_attempts"  # several attempts ended: pick one, open its pull request
SWEEP_ATTEMPTS: Final = "tasuki.sweep_attempts"  # repair picks never sent, delete kept attempt branches
ATTEMPTS_GROUP_PREFIX: Final = "tasuki:attempts:"  # + parent UUID: the hash of a task's attempts (worker/attempt_tasks)
ALERTS: Final = "tasuki.alerts"
UPDATE_MEMORY: Final = "tasuki.update_memory"  # embedding and thread memory of a finished task's episode
REMEMBER_REJECTION: Final = "tasuki.remember_rejection"  # a request closed unmerged: its last review to memory
MERGE_MEMORY: Final = "tasuki.merge_memory"  # the waiting thread memories of one repository into its memory

# Redis keys; every key Tasuki writes starts with KEY_PREFIX so tests and operators can find them
KEY_PREFIX: Final = "tasuki:"
HEARTBEATS_KEY: Final = "tasuki:heartbeats"  # sorted set: UUID scored by its last heartbeat (Redis's epoch seconds)
CLOCK_SKEW_KEY: Final = "tasuki:clock-skew"  # hash: node -> {offset_s: Redis's clock minus the node's, at}
RUNNING_STATUS_PREFIX: Final = "tasuki:running:"  # + status: sorted set of the running UUIDs in that status
DELIVERY_PREFIX: Final = "tasuki:delivery:"  # + webhook delivery id, SET NX EX to drop duplicate deliveries
ACTIVE_PREFIX: Final = "tasuki:active:"  # + task key, holds the UUID of its queued or running task
BEAT_LOCK_KEY: Final = "tasuki:beat-lock"  # held by the one beat that runs the schedule
USER_CONFIG_PREFIX: Final = "tasuki:user-config:"  # + user, cached per-user LLM overrides
CANCEL_PREFIX: Final = "tasuki:cancel:"  # + UUID, set by `tasuki cancel` for a task that is still queued
TASK_PREFIX: Final = "tasuki:task:"  # + UUID, the task key of a task the HTTP intake enqueued (GET before it starts)
STATS_KEY: Final = "tasuki:stats"  # hash: finished tasks per final status, compressions of finished tasks
ALERTS_KEY: Final = "tasuki:alerts"  # hash: each alert gauge's latest value (tasuki.alerts writes, /metrics reads)
REAPED_PREFIX: Final = "tasuki:reaped:"  # + UUID:attempt, SET NX EX by the monitor: one re-enqueue per lost attempt
STOPPED_PREFIX: Final = "tasuki:stopped:"  # + UUID, JSON {status, error, result}: ended, context not finished yet
COUNTED_PREFIX: Final = "tasuki:counted:"  # + UUID, SET NX EX as a task's finish is counted: counted once, by anyone
RESENT_PREFIX: Final = "tasuki:resent:"  # + UUID, INCR by the monitor: re-enqueues so far, bounded by max_attempts
THREAD_PREFIX: Final = "tasuki:thread:"  # + pull/merge request key (source/owner/repo/type/N), JSON of its thread
BRANCH_PREFIX: Final = "tasuki:branch:"  # + source/owner/repo:branch, the pull/merge request key of a Tasuki branch
INBOX_PREFIX: Final = "tasuki:inbox:"  # + UUID, list of comments for the running task, drained at its next step
CI_FIXES_PREFIX: Final = "tasuki:ci-fixes:"  # + pull/merge request key, CI-fix tasks in a row (INCR, reset by people)
AUTOFIX_OFF_PREFIX: Final = "tasuki:autofix-off:"  # + pull/merge request key, set by `/tasuki autofix off`
FORGE_REPLY: Final = "tasuki.forge_reply"  # a short reply on an issue or pull/merge request (unknown commands)
LAST_TASK_PREFIX: Final = "tasuki:last-task:"  # + task key, UUID of its newest finished task (`/tasuki retry`)
CI_SEEN_PREFIX: Final = "tasuki:ci-seen:"  # + pull/merge request key:commit, SET NX: one fix task per failed commit
COMPRESSORS_KEY: Final = "tasuki:compressors"  # sorted set: Celery node consuming `compression`, scored by heartbeat
AUTOFIX: Final = "tasuki.autofix"  # `/tasuki autofix on|off` from a GitLab note, applied after the access check
SPEND_PREFIX: Final = "tasuki:spend:"  # + UTC day:repo:R (hash tokens, cost) | :user:U (tasks) | :replied:thread
MERGE_QUEUED_PREFIX: Final = "tasuki:merge-queued:"  # + repository key, SET NX EX: a merge job is queued for it
MERGE_WAITING_PREFIX: Final = "tasuki:merge-waiting:"  # + repository key, hash: thread key -> UUID that flagged it
MERGE_RUNNING_PREFIX: Final = "tasuki:merge-running:"  # + repository key, SET NX EX by the merge job that runs
SPEND_TOTALS_KEY: Final = "tasuki:spend-totals"  # hash: tokens:{kind}:{model} and cost:{model} since start (/metrics)
RATE_LIMIT_PREFIX: Final = "tasuki:rate-limit:"  # + model profile, sorted set: requests admitted in the window
PERMISSION_PREFIX: Final = "tasuki:permission:"  # + source:owner/repo:person, the person's level there (cached)
REFUSED_PREFIX: Final = "tasuki:refused:"  # + source:owner/repo:item:person, SET NX: a refusal is answered once
HELD_TRIGGERS_KEY: Final = "tasuki:held-triggers"  # sorted set: deliveries whose permission the forge could not say
