"""Every file and directory name of the context store, defined once."""

from __future__ import annotations

RUNNING_DIR = "running"
COMPLETED_DIR = "completed"
STAGING_DIR = ".staging"  # contexts are built here, then renamed into running/ whole
MUTEX_DIR = ".locks"  # one flock file per UUID serialising every change to a .lock

METADATA_FILE = "metadata.json"
STATE_FILE = "state.json"
MESSAGES_FILE = "messages.jsonl"
SUMMARIES_FILE = "summaries.jsonl"
TOOLS_FILE = "tools.jsonl"
REQUESTS_FILE = "requests.jsonl"  # each model call's request, delta-coded and compressed (contexts/requests.py)
LOCK_FILE = ".lock"
STATE_LOCK_FILE = ".state.lock"

JSONL_FILES = (MESSAGES_FILE, SUMMARIES_FILE, TOOLS_FILE)  # made with the context
OPTIONAL_JSONL_FILES = (REQUESTS_FILE,)  # made by the first record: a context that made no model call has none
RECORD_FILES = JSONL_FILES + OPTIONAL_JSONL_FILES  # every JSONL file a copy, an archive or a rebuild carries
GZIP_SUFFIX = ".gz"

DIR_MODE = 0o700
FILE_MODE = 0o600

STATE_LOCK_TIMEOUT_S = 5.0

ACTIVE_STATUSES = ("initializing", "processing", "compressing", "completing")
FINAL_STATUSES = ("completed", "failed", "timeout", "cancelled")

INDEX_FILE = "index.sqlite3"  # the context index (contexts/index.py), beside running/ and completed/
OUTCOMES_FILE = "outcomes.sqlite3"  # what became of the pull/merge requests tasks opened (contexts/outcomes_sqlite.py)
