"""Typed sections of Tasuki's configuration (SPEC §9); each attribute's docstring documents its key.

`worker.settings` turns config.yaml and the environment into these models; nothing here reads either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Self, cast

from pydantic import AfterValidator, Field, PrivateAttr, SecretStr, model_validator
from pydantic_core import PydanticCustomError

from agent.mcp.settings import MCPSettings
from agent.settings import AgentSettings, LLMProfile, LLMSettings
from contexts.compression import CompressionPolicy
from contexts.masking import mask_value
from contexts.prices import PriceBook, price_book
from contexts.sections import (
    Fraction,
    HashableDict,
    HttpUrl,
    Name,
    PositiveFloat,
    PositiveInt,
    Section,
    cross_field_error,
)
from fleet.settings import FleetSettings
from sandbox.settings import EnvironmentsSettings, SandboxSettings
from worker.attempts import MAX_ATTEMPTS
from worker.auth_settings import AuthSettings
from worker.env_file import LoadedEnvFile

AuthorAssociation = Literal[
    "OWNER", "MEMBER", "COLLABORATOR", "CONTRIBUTOR", "FIRST_TIME_CONTRIBUTOR", "FIRST_TIMER", "MANNEQUIN", "NONE"
]
RepositoryPermission = Literal["owner", "admin", "write", "read", "none"]  # Gitea's collaborator permission


def _broker_url(value: str) -> str:
    if not value.startswith(("redis://", "rediss://", "unix://", "sentinel://")):
        raise PydanticCustomError("broker_url", "expected a redis://, rediss://, unix:// or sentinel:// URL")
    return value


class ConfigSource(NamedTuple):
    """Where settings came from: the configuration file (None: built-in defaults) and the directory
    that relative paths in it resolve against (the file's directory, else the working directory)."""

    file: Path | None
    root: Path
    configured: frozenset[tuple[str, ...]] = frozenset()
    """The keys the file or an environment variable set (a value equal to the built-in default written in the file,
    as the reference config.yaml does, does not count)."""
    secrets: LoadedEnvFile | None = None
    """The ``tasuki.env`` beside the file that the command line loaded at its start, if any."""

    def describe(self) -> str:
        """One line for a person: which file (and secrets file), or which defaults and which directory."""
        if self.file is not None:
            return f"configuration {self.file}" + (f", {self.secrets.describe()}" if self.secrets else "")
        return f"no configuration file: built-in defaults, relative paths under {self.root}"

    def sets(self, *key: str) -> bool:
        """Whether the operator chose this key (or a section around it) rather than leaving the default."""
        return any(key[:n] in self.configured for n in range(1, len(key) + 1))


class BrokerSettings(Section):
    url: Annotated[str, AfterValidator(_broker_url)] = "redis://localhost:6379/0"
    """Redis URL of the Celery broker, result backend and heartbeat index."""
    visibility_timeout_s: PositiveInt = 21600
    """Seconds before Redis redelivers an unacknowledged task; must exceed agent.time_limit_s."""


class RetentionSettings(Section):
    gzip_after_days: PositiveInt = 7
    """Compress completed contexts older than this many days."""
    delete_after_days: PositiveInt = 30
    """Delete completed contexts older than this many days."""

    @model_validator(mode="after")
    def _gzip_before_delete(self) -> Self:
        if self.gzip_after_days > self.delete_after_days:
            expected = f"at most delete_after_days ({self.delete_after_days})"
            raise cross_field_error("gzip_after_days", self.gzip_after_days, expected)
        return self


class ContextsSettings(Section):
    base_dir: Path = Path("logs/contexts")
    """Root of the context store (holds running/ and completed/)."""
    workspaces_dir: Path = Path("var/workspaces")
    """Where each task's repository checkout lives, one directory per UUID (finished ones wait in .idle/)."""
    git_cache_dir: Path = Path("var/git-cache")
    """This host's bare mirror of each task repository (refreshed by git fetch) and the worker's checkout indexes."""
    warm_copy_days: Annotated[float, Field(ge=1)] = 7.0
    """Days an idle working copy or a mirror may go unused on a host before the workers delete it (checked hourly)."""
    heartbeat_interval_s: PositiveInt = 30
    """Seconds between heartbeats of a running task."""
    stale_after_s: PositiveInt = 60
    """A lock whose heartbeat is older than this many seconds may be taken over."""
    hung_after_s: PositiveInt | None = None
    """A holder silent this long loses its task even while its process lives (stopped or wedged); the monitor
    kills it on its own host. Unset: 5 x stale_after_s."""
    max_clock_skew_s: PositiveFloat = 2.0
    """A process whose clock differs from Redis's by more than this says so at start and in /healthz."""
    fsync: Literal["always", "step", "never"] = "step"
    """When appends reach the disk: after every record, after every agent step, or when the OS decides."""
    retention: RetentionSettings = RetentionSettings()
    """How long completed contexts are kept."""

    @model_validator(mode="after")
    def _heartbeat_within_staleness(self) -> Self:
        # A heartbeat slower than the staleness limit would make every live task look dead.
        if self.heartbeat_interval_s >= self.stale_after_s:
            expected = f"less than stale_after_s ({self.stale_after_s})"
            raise cross_field_error("heartbeat_interval_s", self.heartbeat_interval_s, expected)
        if self.hung_after_s is not None and self.hung_after_s <= self.stale_after_s:
            expected = f"more than stale_after_s ({self.stale_after_s})"
            raise cross_field_error("hung_after_s", self.hung_after_s, expected)
        return self

    @property
    def hung_after(self) -> float:
        """``hung_after_s``, or its default of five times ``stale_after_s``."""
        return float(self.hung_after_s if self.hung_after_s is not None else 5 * self.stale_after_s)


class CompressionSettings(Section):
    warn_at: Fraction = 0.6
    """Fraction of context_length at which a warning is logged."""
    threshold: Fraction = 0.7
    """Fraction of context_length at which old messages are summarized."""
    min_messages: PositiveInt = 10
    """No compression below this many messages."""
    keep_recent: PositiveInt = 5
    """The newest messages that are never summarized."""
    start_timeout_s: PositiveFloat = 30.0
    """Seconds a compression job may wait for a worker; then the task summarizes in its own worker."""
    timeout_s: PositiveFloat = 600.0
    """Seconds a compression job may take before the task goes on without it (emergency rule)."""
    concurrency: PositiveInt = 8
    """Summaries at once in each compression worker that `tasuki worker` starts beside the task worker (threads:
    a summary is a wait on the model, so compression never waits for a free task process)."""

    def policy(self, threshold: float | None = None) -> CompressionPolicy:
        """The compression policy of these settings; ``threshold`` overrides (a task's own, from its metadata)."""
        return CompressionPolicy(
            warn_at=self.warn_at,
            threshold=self.threshold if threshold is None else threshold,
            min_messages=self.min_messages,
            keep_recent=self.keep_recent,
        )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.warn_at > self.threshold:
            raise cross_field_error("warn_at", self.warn_at, f"at most threshold ({self.threshold})")
        if self.keep_recent >= self.min_messages:
            expected = f"less than min_messages ({self.min_messages})"
            raise cross_field_error("keep_recent", self.keep_recent, expected)
        return self


class MonitorSettings(Section):
    interval_s: PositiveInt = 30
    """Seconds between runs of the stale-task monitor."""
    max_attempts: PositiveInt = 3
    """Runs of one task (first run included) before a lost task is failed instead of resumed."""
    resume: bool = True
    """Resume lost tasks on another worker; false fails them at once."""
    beat_lock_ttl_s: PositiveInt = 30
    """Seconds the running beat's Redis lock lasts unrenewed; a standby beat takes over this long after it dies."""


class AlertSettings(Section):
    disk_warn_gb: PositiveFloat = 10
    """Disk use of running/ plus completed/ that raises a warning."""
    disk_critical_gb: PositiveFloat = 50
    """Disk use of running/ plus completed/ that raises a critical alert."""
    failure_rate: Fraction = 0.1
    """Share of failed recent tasks above which an alert is raised."""
    max_running: PositiveInt = 100
    """Running tasks above which an alert is raised."""
    max_runtime_h: PositiveFloat = 6
    """Hours a task may run before an alert is raised."""
    interval_s: PositiveInt = 300
    """Seconds between alert checks (the tasuki.alerts beat entry)."""
    recent_h: PositiveFloat = 24
    """Tasks that finished within this many hours make up the failure rate."""

    @model_validator(mode="after")
    def _warn_before_critical(self) -> Self:
        if self.disk_warn_gb > self.disk_critical_gb:
            expected = f"at most disk_critical_gb ({self.disk_critical_gb})"
            raise cross_field_error("disk_warn_gb", self.disk_warn_gb, expected)
        return self


class WebhookSettings(Section):
    host: str = "0.0.0.0"  # noqa: S104 - the receiver runs in a container and must be reachable from outside
    """Address the HTTP intake binds to."""
    port: Annotated[int, Field(gt=0, lt=65536)] = 8080
    """Port the HTTP intake listens on."""
    max_body_bytes: PositiveInt = 26214400
    """Larger request bodies are refused with 413."""


class APISettings(Section):
    allowed_repo_roots: tuple[Path, ...] = ()
    """Directories under which POST /api/tasks may name a repo_path; empty: local paths are refused over HTTP."""


class LabelSettings(Section):
    trigger: Name = "coding agent"
    """Adding this label to an issue starts a task."""
    processing: Name = "coding agent processing"
    """Set while the task runs."""
    done: Name = "coding agent done"
    """Set when the task completed."""
    failed: Name = "coding agent failed"
    """Set when the task failed, timed out or was cancelled."""


class GitHubSettings(Section):
    api_url: HttpUrl = "https://api.github.com"
    """REST API root (GitHub Enterprise: https://HOST/api/v3)."""
    auth: Literal["token", "app"] = "token"
    """How Tasuki signs in: token (GITHUB_TOKEN) or app (a GitHub App: app_id and GITHUB_APP_PRIVATE_KEY)."""
    app_id: PositiveInt | None = None
    """The GitHub App's ID (with auth: app); its private key comes from the environment only."""
    bot_login: Name = "tasuki-bot"
    """The bot's account; events it sends are ignored (with auth: app, the App's SLUG[bot])."""
    mention: Name = "@tasuki"
    """A comment containing this starts a task."""
    allowed_associations: tuple[AuthorAssociation, ...] = ("OWNER", "MEMBER", "COLLABORATOR")
    """Author associations whose comments may start a task."""
    labels: LabelSettings = LabelSettings()
    """Label names of the trigger → processing → done / failed state machine."""

    @model_validator(mode="after")
    def _app_needs_its_id(self) -> Self:
        if self.auth == "app" and self.app_id is None:
            raise cross_field_error("app_id", None, "the GitHub App's ID (github.auth is app)")
        return self


class GitLabSettings(Section):
    api_url: HttpUrl = "https://gitlab.com/api/v4"
    """REST API root of the GitLab instance."""
    bot_login: Name = "tasuki-bot"
    """The bot's username; events it sends are ignored."""
    mention: Name = "@tasuki"
    """A note containing this starts a task."""
    labels: LabelSettings = LabelSettings()
    """Label names of the trigger → processing → done / failed state machine."""


class GiteaSettings(Section):
    api_url: HttpUrl = "https://gitea.com/api/v1"
    """REST API root of the Gitea or Forgejo instance (Codeberg: https://codeberg.org/api/v1)."""
    bot_login: Name = "tasuki-bot"
    """The bot's username; events it sends are ignored."""
    mention: Name = "@tasuki"
    """A comment containing this starts a task."""
    allowed_permissions: tuple[RepositoryPermission, ...] = ("owner", "admin", "write")
    """Repository permissions whose holders' comments may start a task (checked by a worker: payloads carry none)."""
    labels: LabelSettings = LabelSettings()
    """Label names of the trigger → processing → done / failed state machine (created when missing)."""




PermissionLevel = Literal["none", "read", "triage", "write", "maintain", "admin"]
"""One scale for every forge's repository permission (worker/permissions.py maps each forge's onto it)."""


class PermissionSettings(Section):
    check: bool = True
    """Check every trigger's person against the forge's real repository permission (false: trust any author the
    payload allows, as before issue 40; only for a forge whose every commenter may run code)."""
    minimum: PermissionLevel = "write"
    """The least permission (none < read < triage < write < maintain < admin) whose holder's label, comment,
    review, /tasuki command or push may start or steer a task."""
    repositories: Annotated[dict[Name, PermissionLevel], AfterValidator(HashableDict)] = Field(
        default_factory=HashableDict)
    """``{owner/name: level}``: a repository's own minimum (owner/name compared without case)."""
    cache_s: Annotated[int, Field(ge=0)] = 300
    """Seconds a person's permission is kept in Redis (dropped sooner on member, membership, organization events)."""
    timeout_s: PositiveFloat = 10.0
    """Seconds the intake waits for the forge's answer; no answer holds the delivery for a retry."""
    retry_s: PositiveFloat = 30.0
    """Seconds before a held delivery is checked again (doubling each time)."""
    retries: Annotated[int, Field(ge=0)] = 6
    """Checks again of a held delivery before it is refused for good (fail closed)."""


class FollowupSettings(Section):
    max_ci_fixes: Annotated[int, Field(ge=0)] = 2
    """CI-fix tasks in a row per pull/merge request; a person's review or `/tasuki autofix on` resets the count."""
    ci_log_lines: PositiveInt = 200
    """Lines kept from the end of each failed CI job's log for the fix task's prompt."""


AttemptCount = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)]


class AttemptsSettings(Section):
    default: AttemptCount = 1
    """Agents per task, each on its own branch; the best attempt is delivered (docs/attempts.md). 1: one agent."""
    repositories: Annotated[dict[Name, AttemptCount], AfterValidator(HashableDict)] = Field(
        default_factory=HashableDict)
    """Attempts per repository: {"owner/name" or "source/owner/name": N}."""
    labels: Annotated[dict[Name, AttemptCount], AfterValidator(HashableDict)] = Field(default_factory=HashableDict)
    """Attempts per issue label: {LABEL: N} (the most any of the issue's labels asks for; over the repository's)."""
    keep_branches_days: PositiveFloat = 7.0
    """Days the branches of the attempts not delivered are kept (to compare, or to take over by hand)."""
    reviewer: Name | None = None
    """The model profile that compares the diffs of attempts whose checks tie; null: the smallest change wins."""


class LocalSettings(Section):
    data_dir: Path | None = None
    """Where every default relative path (var/, logs/contexts, workspaces, git cache, evals) resolves; null: the
    configuration file's directory, else beside the checkout, else $XDG_DATA_HOME/tasuki — never the working
    directory."""
    var_dir: Path = Path("var")
    """This machine's own files: the embedded Redis of up and demo (and its URL), the beat schedule, the demo."""


class MemorySettings(Section):
    path: Path | None = None
    """The memory database (SQLite, WAL); null: memory.db beside the contexts root."""
    embeddings: Literal["endpoint", "local"] = "endpoint"
    """Where recall's vectors come from: endpoint (embedding_model on the provider's endpoint) or local
    (all-MiniLM-L6-v2 in the worker process, offline; needs tasuki[embeddings])."""
    embedding_model: Name | None = None
    """Embedding model of the configured provider (OpenAI /v1/embeddings, Ollama embed); null: BM25 only."""
    embedding_timeout_s: PositiveFloat = 10.0
    """Seconds one embedding request may take; then recall goes on with BM25 alone."""
    vector_weight: Fraction = 0.8
    """Share of the vectors in recall's fused score (the rest is BM25's); 0.8 suits a real embedding model."""
    recall_k: PositiveInt = 5
    """Most past episodes recall returns (and the first prompt gets)."""
    prompt_share: Fraction = 0.15
    """Share of context_length the first prompt gives to instructions, memories and recalled episodes."""
    repo_max_tokens: PositiveInt = 2000
    """Bound of a repository memory (and of a thread memory) in tokens; a longer update is refused."""
    prune_after_days: PositiveInt = 90
    """Episodes older than this many days are deleted (tasuki memory prune, the daily retention job)."""

    @property
    def embedder(self) -> str | None:
        """The embedding model recall uses, as ``memory status`` and usage records name it; None: BM25 only."""
        if self.embeddings == "local":
            return "all-MiniLM-L6-v2 (local)"
        return self.embedding_model

    def database(self, contexts: ContextsSettings) -> Path:
        """Where the memory database is: ``path``, else ``memory.db`` beside the contexts root."""
        return self.path if self.path is not None else Path(contexts.base_dir).parent / "memory.db"


class ModelPrice(Section):
    """USD per million tokens of one model (SPEC §16)."""

    input: Annotated[float, Field(ge=0)]
    """Prompt tokens the provider did not serve from its cache."""
    cached_input: Annotated[float, Field(ge=0)] = 0.0
    """Prompt tokens served from the provider's prompt cache."""
    cache_write: Annotated[float, Field(ge=0)] | None = None
    """Prompt tokens written to the provider's prompt cache; null: the vendor's premium for a model of the built-in
    table (Claude: 1.25x input), else the input price (OpenAI bills writes as input)."""
    output: Annotated[float, Field(ge=0)]
    """Completion tokens."""


class PriceTable(HashableDict):
    """``pricing``: {model name: ModelPrice}, a mapping that hashes."""


Pricing = Annotated[dict[Name, ModelPrice], AfterValidator(PriceTable)]


DEFAULT_TASK_COST = 3.0
"""USD a task may cost unless limits.task_cost says otherwise: mini-swe-agent's and SWE-agent's per-task limit.
Issue 37's recorded 40-step bug fix costs $0.4-$2.2 of input with prompt caching (Sonnet to Opus 4.1): an ordinary
task fits, while a task that loops (100 steps of a full 128k window uncached: $32 on GPT-4o) stops early and hands
over what it did."""


class LimitSettings(Section):
    task_tokens: PositiveInt | None = None
    """Tokens one task may use (every model call of it); the task stops within one step. null: no limit."""
    task_cost: PositiveFloat | None = DEFAULT_TASK_COST
    """USD one task may cost; counts only calls whose model has a price (pricing, or the built-in table), so it
    never stops a task of an unpriced model (a local one). The task stops within one step. null: no limit."""
    repo_tokens: PositiveInt | None = None
    """Tokens one repository's tasks may use per UTC day; then its triggers get over_budget. null: no limit."""
    repo_cost: PositiveFloat | None = None
    """USD one repository's tasks may cost per UTC day; then its triggers get over_budget. null: no limit."""
    user_tasks: PositiveInt | None = None
    """Tasks one user may start per UTC day; then the user's triggers get over_budget. null: no limit."""
    team_tasks: PositiveInt | None = None
    """Tasks one team (auth.teams, from the person's groups) may start per UTC day through the API or the console;
    then its people's submissions get over_budget. null: no limit."""
    team_cost: PositiveFloat | None = None
    """USD one team's tasks may cost per UTC day (priced calls only); then its people's submissions get
    over_budget. null: no limit."""

    @property
    def per_day(self) -> bool:
        """Whether any daily cap is set (the intake checks Redis only then)."""
        caps = (self.repo_tokens, self.repo_cost, self.user_tasks, self.team_tasks, self.team_cost)
        return any(v is not None for v in caps)
class ConsoleSettings(Section):
    enabled: bool = False
    """Serve the operators' console under /console/ (tasuki up and the demo turn it on, bound to 127.0.0.1)."""
    token: SecretStr | None = None
    """The console's sign-in token (set it through TASUKI__CONSOLE__TOKEN); null: the API token."""
    session_lifetime_s: PositiveInt = 8 * 3600
    """Seconds a console session lasts after signing in."""
    signin_attempts_per_minute: PositiveInt = 5
    """Sign-in attempts allowed per client address and minute; more are refused with 429."""
    host: str = "127.0.0.1"
    """Address `tasuki console` binds to when it serves the console alone."""
    port: Annotated[int, Field(gt=0, lt=65536)] = 8765
    """Port `tasuki console` listens on when it serves the console alone."""
    public_url: HttpUrl | None = None
    """The console as people reach it (e.g. https://tasuki.example.com/console): pull requests link the task's page
    there; null: no link."""


class UserConfigAPISettings(Section):
    url: HttpUrl | None = None
    """Base URL answering GET {url}/config/{user} with per-user LLM overrides; null disables it."""


class Secrets(Section):
    """Credentials, read only from unprefixed environment variables; never dumped or shown."""

    openai_api_key: SecretStr | None = None
    github_token: SecretStr | None = None
    github_app_private_key: SecretStr | None = None
    gitlab_token: SecretStr | None = None
    github_webhook_secret: SecretStr | None = None
    gitlab_webhook_secret: SecretStr | None = None
    gitea_token: SecretStr | None = None
    gitea_webhook_secret: SecretStr | None = None
    tasuki_api_token: SecretStr | None = None
    tasuki_console_session_secret: SecretStr | None = None
    """The key console session cookies are signed with (TASUKI_CONSOLE_SESSION_SECRET)."""
    oidc_client_secret: SecretStr | None = None
    """The OpenID Connect client secret, from the variable auth.oidc.client_secret_env names."""


class Settings(Section):
    """Everything Tasuki is configured with; build it with `worker.settings.load_settings()`."""

    broker: BrokerSettings = BrokerSettings()
    """The Redis broker."""
    contexts: ContextsSettings = ContextsSettings()
    """The durable context store."""
    llm: LLMSettings = LLMSettings()
    """The language model."""
    compression: CompressionSettings = CompressionSettings()
    """When and how much of a conversation is summarized."""
    agent: AgentSettings = AgentSettings()
    """Limits of one task."""
    monitor: MonitorSettings = MonitorSettings()
    """The stale-task monitor."""
    alerts: AlertSettings = AlertSettings()
    """Alert thresholds."""
    webhook: WebhookSettings = WebhookSettings()
    """The HTTP intake."""
    api: APISettings = APISettings()
    """The task API."""
    github: GitHubSettings = GitHubSettings()
    """GitHub events and API."""
    gitlab: GitLabSettings = GitLabSettings()
    """GitLab events and API."""
    gitea: GiteaSettings = GiteaSettings()
    """Gitea / Forgejo events and API."""
    user_config_api: UserConfigAPISettings = UserConfigAPISettings()
    """Optional per-user settings service."""
    sandbox: SandboxSettings = SandboxSettings()
    """Isolation of the agent's tool commands."""
    mcp: MCPSettings = MCPSettings()
    """MCP servers whose tools the agent gets: the operator's, and those a repository declares."""
    environments: EnvironmentsSettings = EnvironmentsSettings()
    """Each repository's environment: declared, set up once, restored for every task (SPEC §17)."""
    permissions: PermissionSettings = PermissionSettings()
    """Who may start or steer a task: each trigger's person checked against the forge (docs/permissions.md)."""
    followups: FollowupSettings = FollowupSettings()
    """Follow-up tasks on a pull/merge request a task opened: reviews, CI failures (SPEC §14)."""
    attempts: AttemptsSettings = AttemptsSettings()
    """Several agents per task on separate branches, the best one delivered (issue 39, docs/attempts.md)."""
    local: LocalSettings = LocalSettings()
    """Files kept on this machine."""
    memory: MemorySettings = MemorySettings()
    """Memory that outlives a task: episodes, thread and repository memories, recall."""
    fleet: FleetSettings = FleetSettings()
    """Many hosts (SPEC §12): leases and the durable copy of every context in PostgreSQL; unset, one host."""
    pricing: Pricing = Field(default_factory=PriceTable)
    """USD per million tokens by model name: {MODEL: {input, cached_input, cache_write, output}}; each entry overrides
    the built-in price of its model (dated snapshots match their model); empty: the built-in table only."""
    limits: LimitSettings = LimitSettings()
    """Budgets: per task, and per repository and user per UTC day (SPEC §16)."""
    console: ConsoleSettings = ConsoleSettings()
    """The operators' web console: fleet, tasks and each task's context (SPEC §15)."""
    auth: AuthSettings = AuthSettings()
    """Sign-in through OpenID Connect, roles from the provider's groups, break-glass (docs/console-auth.md)."""

    # Private attributes: never validated from config.yaml, never in repr or model_dump.
    _secrets: Secrets = PrivateAttr(default_factory=Secrets)
    _source: ConfigSource = PrivateAttr(default_factory=lambda: ConfigSource(None, Path.cwd()))

    @property
    def secrets(self) -> Secrets:
        """Credentials from the environment."""
        return self._secrets

    @property
    def source(self) -> ConfigSource:
        """Which configuration file these settings came from, and the directory relative paths resolve against."""
        return self._source

    def with_secrets(self, secrets: Secrets) -> Settings:
        """A copy of these settings carrying `secrets`."""
        copy = self.model_copy()
        copy._secrets = secrets
        return copy

    def with_source(self, source: ConfigSource) -> Settings:
        """A copy of these settings that says where they came from."""
        copy = self.model_copy()
        copy._source = source
        return copy

    @model_validator(mode="after")
    def _redelivery_after_time_limit(self) -> Self:
        # Redis redelivers on a fixed timer (SPEC §5): a shorter timeout re-runs tasks that are still alive.
        if self.broker.visibility_timeout_s <= self.agent.time_limit_s:
            expected = f"more than agent.time_limit_s ({self.agent.time_limit_s})"
            raise cross_field_error("broker.visibility_timeout_s", self.broker.visibility_timeout_s, expected)
        return self

    @model_validator(mode="after")
    def _reviewer_is_a_profile(self) -> Self:
        reviewer = self.attempts.reviewer
        if reviewer is not None and reviewer not in self.llm.profile_names():
            raise cross_field_error("attempts.reviewer", reviewer,
                                    f"a profile of llm.models ({', '.join(sorted(self.llm.profile_names()))})")
        return self

    @model_validator(mode="after")
    def _cost_caps_need_prices(self) -> Self:
        # A cost cap of the operator's where no configured model has a price could never be reached: every cost
        # would be "no prices configured". The default task_cost (also as config.yaml writes it out) is no such
        # promise: it applies where a price is known.
        for name in ("task_cost", "repo_cost", "team_cost"):
            value = getattr(self.limits, name)
            default = LimitSettings.model_fields[name].default
            if value is not None and value != default and not self.prices_known():
                models = ", ".join(sorted({self.llm.profile(p).model for p in self.llm.profile_names()}))
                raise cross_field_error(f"limits.{name}", value,
                                        f"a price for a configured model ({models}) in pricing (no cost can be "
                                        "counted)")
        return self

    def prices(self) -> PriceBook:
        """What calls cost: ``pricing``, over the built-in table of common models (:mod:`contexts.prices`)."""
        return price_book(cast(PriceTable, self.pricing))  # validated into a PriceTable: it hashes

    def prices_known(self) -> bool:
        """Whether any cost can be counted: a ``pricing`` entry, or a price for a configured profile's model."""
        book = self.prices()
        return bool(self.pricing) or any(book.knows(self.llm.profile(p).model) for p in self.llm.profile_names())

    def llm_profile(self, name: str | None = None) -> LLMProfile:
        """The model profile ``name`` (None: the default one); raises KeyError for an unknown name."""
        return self.llm.profile(name)

    def console_token(self) -> str | None:
        """The console's sign-in token: ``console.token``, else the API token; None: nobody can sign in."""
        for token in (self.console.token, self.secrets.tasuki_api_token):
            if token is not None and token.get_secret_value():  # an empty token would let an empty password in
                return token.get_secret_value()
        return None

    def public_dump(self) -> dict[str, Any]:
        """All settings as JSON-ready data, without secrets and with URL credentials masked."""
        return cast(dict[str, Any], mask_value(self.model_dump(mode="json")))
