"""The agent's settings sections: ``llm`` (providers, model profiles, retries) and ``agent`` (steps, time,
tool output). Each attribute's docstring documents its key; ``worker.settings`` loads them with the rest."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, NamedTuple, Self

from pydantic import AfterValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from agent.llm import registry
from contexts.sections import (
    HashableDict,
    HttpUrl,
    Name,
    PositiveFloat,
    PositiveInt,
    Section,
    cross_field_error,
)


class OpenAISettings(Section):
    ENDPOINT_KEY: ClassVar[str] = "base_url"

    base_url: HttpUrl | None = None
    """OpenAI-compatible endpoint (vLLM, llama.cpp, LM Studio, Ollama's /v1); null means api.openai.com."""
    model: Name = "gpt-4o"
    """Model name sent with every request."""
    context_length: PositiveInt = 128000
    """The model's context window in tokens; the compression budget."""

    @property
    def endpoint(self) -> str | None:
        """Where the provider is: the base URL."""
        return self.base_url


class OllamaSettings(Section):
    ENDPOINT_KEY: ClassVar[str] = "host"

    host: HttpUrl = "http://localhost:11434"
    """URL of the Ollama server."""
    model: Name = "qwen3:30b"
    """Model name sent with every request."""
    context_length: PositiveInt = 32768
    """The model's context window in tokens; also sent as options.num_ctx."""

    @property
    def endpoint(self) -> str | None:
        """Where the provider is: the host."""
        return self.host


LEGACY_SECTIONS: dict[str, type[OpenAISettings | OllamaSettings]] = {"openai": OpenAISettings, "ollama": OllamaSettings}
"""``llm.provider``'s values and the section each names (configurations older than ``llm.models``)."""


def _provider_name(value: str) -> str:
    if not registry.known(value):
        raise PydanticCustomError("provider", "expected one of {names}", {"names": ", ".join(registry.names())})
    return value


ProviderName = Annotated[str, AfterValidator(_provider_name)]
Effort = Literal["minimal", "low", "medium", "high"]


class ModelRateLimits(Section):
    requests_per_minute: PositiveInt | None = None
    """Requests all workers together may send with this profile per minute (a limiter in Redis); null: no limit."""
    tokens_per_minute: PositiveInt | None = None
    """Prompt and output tokens all workers together may send per minute; null: no limit."""


Headers = Annotated[dict[str, str], AfterValidator(HashableDict)]


class ModelProfileSettings(Section):
    provider: ProviderName
    """The API: anthropic (Messages), openai (Chat Completions, any compatible server), openai-responses
    (Responses), ollama."""
    model: Name
    """Model name sent with every request."""
    context_length: PositiveInt = 128000
    """The model's context window in tokens; the compression budget."""
    base_url: HttpUrl | None = None
    """The API's base URL (an OpenAI-compatible server, a gateway) or the Ollama host; null: the vendor's own."""
    api_key_env: Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")] | None = None
    """The environment variable holding this profile's key; null: the provider's usual one (OPENAI_API_KEY,
    ANTHROPIC_API_KEY). Keys never live in the configuration."""
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    """Sampling temperature; null: the model's default."""
    max_output_tokens: PositiveInt | None = None
    """Most tokens one answer may have (max_tokens, max_completion_tokens, max_output_tokens, num_predict)."""
    effort: Effort | None = None
    """Reasoning effort for models that take one (OpenAI's reasoning.effort, Anthropic's output_config.effort, Ollama's
    think level); null: the model's default."""
    thinking_tokens: PositiveInt | None = None
    """Extended thinking: Anthropic's budget_tokens, Ollama's think on; null: off."""
    adaptive_thinking: bool = False
    """Anthropic's adaptive thinking (Claude Opus 4.6, Sonnet 4.6 and later; the only kind some newer models take):
    the model decides when and how much to think, guided by effort; instead of thinking_tokens."""
    headers: Headers = Field(default_factory=HashableDict)
    """Extra HTTP headers sent with every request (a gateway's routing header, a beta flag)."""
    rate_limits: ModelRateLimits = ModelRateLimits()
    """What all workers together may send with this profile."""
    fallbacks: tuple[Name, ...] = ()
    """Profiles that take over, in order, when this one stays down for the whole retry window."""

    @model_validator(mode="after")
    def _one_kind_of_thinking(self) -> Self:
        if self.adaptive_thinking and self.thinking_tokens is not None:
            raise cross_field_error("adaptive_thinking", True, "false when thinking_tokens is set (one kind)")
        return self


class LLMProfile(NamedTuple):
    """A resolved model profile: its name, the connection, and every setting a provider needs."""

    name: str
    provider: str
    model: str
    context_length: int
    endpoint: str | None
    """The API's base URL or the Ollama host (None: the vendor's own)."""
    settings: ModelProfileSettings


Profiles = Annotated[dict[Name, ModelProfileSettings], AfterValidator(HashableDict)]
Choices = Annotated[dict[Name, Name], AfterValidator(HashableDict)]


class LLMSettings(Section):
    provider: Literal["openai", "ollama"] = "openai"
    """Which provider section below makes the built-in profile (named after it) when llm.models has none."""
    openai: OpenAISettings = OpenAISettings()
    """Settings of the openai provider."""
    ollama: OllamaSettings = OllamaSettings()
    """Settings of the ollama provider."""
    models: Profiles = Field(default_factory=HashableDict)
    """Named model profiles: {NAME: {provider, model, context_length, base_url, api_key_env, temperature,
    max_output_tokens, effort, thinking_tokens, adaptive_thinking, headers, rate_limits, fallbacks}}."""
    default: Name | None = None
    """The profile of a task that chooses none; null: the built-in profile of llm.provider."""
    summarizer: Name | None = None
    """The profile that writes compression summaries (a cheaper model); null: the task's own."""
    memory: Name | None = None
    """The profile of the memory jobs (thread and repository memory); null: the task's own."""
    repositories: Choices = Field(default_factory=HashableDict)
    """A profile per repository: {"owner/name" or "source/owner/name": PROFILE}."""
    timeout_s: PositiveFloat = 600.0
    """Seconds one model request may take before it counts as failed (and is retried)."""
    retry_for_s: PositiveFloat = 600.0
    """Seconds a model may keep failing one request (rate limits, 5xx, timeouts, connection errors; counted from
    the first failure) before it counts as unavailable: a fallback profile takes over, else the task stops."""
    max_retries: Annotated[int, Field(ge=0)] | None = None
    """Most retries of one request besides the window; null: as many as retry_for_s holds."""
    backoff_base_s: PositiveFloat = 1.0
    """First retry delay in seconds when the server names none (Retry-After); it doubles per retry, with jitter."""
    backoff_max_s: PositiveFloat = 60.0
    """Longest retry delay of our own backoff; a Retry-After the server sends is waited as it is, within the window."""

    @model_validator(mode="after")
    def _profiles_exist(self) -> Self:
        known = set(self.models) | {self.provider}
        named = [("default", self.default), ("summarizer", self.summarizer), ("memory", self.memory)]
        named += [(f"repositories.{repo}", name) for repo, name in self.repositories.items()]
        named += [(f"models.{owner}.fallbacks", name) for owner, p in self.models.items() for name in p.fallbacks]
        for field, name in named:
            if name is not None and name not in known:
                raise cross_field_error(field, name, f"a profile of llm.models ({', '.join(sorted(known))})")
        return self

    def profile_names(self) -> tuple[str, ...]:
        """Every profile a task may choose: llm.models's and the built-in one."""
        return tuple(dict.fromkeys([*self.models, self.provider]))

    def profile(self, name: str | None = None) -> LLMProfile:
        """The profile called ``name`` (None: the default); raises KeyError for an unknown name."""
        name = name or self.default or self.provider
        chosen = self.models.get(name)
        if chosen is None:
            if name != self.provider:
                raise KeyError(name)
            chosen = self._built_in()
        return LLMProfile(name, chosen.provider, chosen.model, chosen.context_length, chosen.base_url, chosen)

    def _built_in(self) -> ModelProfileSettings:
        """llm.provider's section as a profile (configurations older than llm.models)."""
        section: OpenAISettings | OllamaSettings = getattr(self, self.provider)
        return ModelProfileSettings(provider=self.provider, model=section.model,
                                    context_length=section.context_length, base_url=section.endpoint)



class AgentSettings(Section):
    max_steps: PositiveInt = 100
    """LLM calls per task before it fails."""
    soft_time_limit_s: PositiveInt = 12600
    """Seconds after which a task is asked to stop at the next step."""
    time_limit_s: PositiveInt = 14400
    """Seconds after which the worker process running a task is killed."""
    tool_output_max_chars: PositiveInt = 20000
    """Tool output beyond this many characters is cut before it reaches the model."""
    bash_timeout_s: PositiveInt = 600
    """Default and ceiling of one bash command's run time, in seconds."""
    shutdown_grace_s: PositiveInt = 60
    """On SIGTERM, seconds a worker waits for running tasks to reach a step boundary and hand back."""
    max_format_errors: PositiveInt = 3
    """Replies in a row without a tool call Tasuki can run (native, or written in the text) before a task fails."""
    max_repeats: PositiveInt = 6
    """One call (its tool and arguments) answered with the same output this many times in a row ends the task; from
    the third the model is told (agent/repeats.py)."""
    finish_gate: bool = True
    """The agent's first finish is answered with a review (its diff, new files, changed tests, the checks' results)
    and only the next one is accepted; scratch files it does not keep are removed (docs/finish-gate.md)."""
    checks: tuple[str, ...] = ()
    """Bash commands the finish gate runs for a repository without a .tasuki/checks; none: the test command detected
    from the repository's files."""
    check_timeout_s: PositiveInt = 600
    """Seconds one check of the finish gate may run before it is killed (and counted as failed)."""

    @model_validator(mode="after")
    def _soft_before_hard(self) -> Self:
        if self.soft_time_limit_s >= self.time_limit_s:
            expected = f"less than time_limit_s ({self.time_limit_s})"
            raise cross_field_error("soft_time_limit_s", self.soft_time_limit_s, expected)
        return self
