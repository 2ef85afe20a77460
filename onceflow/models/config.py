"""The `model:` block of an agent in agents.yaml: one shape per provider, chosen by `provider`.

    model: {provider: scripted, script: [...]}
    model: {provider: openai, model: gpt-4o-mini}                      # key from $OPENAI_API_KEY
    model: {provider: openai, model: qwen2.5, base_url: http://127.0.0.1:8000/v1, api_key_env: null}
    model: {provider: anthropic, model: claude-sonnet-4-5, max_output_tokens: 2048}

Keys are never written in the file: `api_key_env` names the environment variable that holds one, read
when the worker builds the client. `null` means the server takes no key (a local llama.cpp, vLLM or
Ollama); a placeholder is sent then, because the SDKs insist on one. Header values may name
variables as `${NAME}`, for gateways that want a token of their own.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from onceflow.models import Model
from onceflow.models.scripted import ScriptedModel, ScriptTurn
from onceflow.sdk.durations import PositiveDuration
from onceflow.sdk.payloads import ModelSpec
from onceflow.sdk.variables import UnsetVariableError, expand_variables, malformed_references, references

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
# What the SDKs are sent when the server takes no key: they refuse to build a client without one.
KEYLESS_PLACEHOLDER = "no-key"


def resolve_model_wrapper(target: str) -> Callable[[Model], Model]:
    """Import a model wrapper named "module:attribute"; ValueError if it is not a callable."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{target!r} is not 'module:attribute'")
    try:
        wrapper = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {target!r}: {exc}") from exc
    if not callable(wrapper):
        raise ValueError(f"{target!r} is not callable")
    return cast(Callable[[Model], Model], wrapper)


class _Common(BaseModel):
    """`wrapper`, optional, is "module:attribute" of a callable that takes the model this config
    describes and returns the model to talk to instead: a seam for instrumentation around every model
    call (the crash drill holds model calls through it, see onceflow/drill/tools.py)."""

    model_config = ConfigDict(extra="forbid")

    wrapper: str | None = None

    def build(self, tools: list[dict[str, Any]]) -> Model:
        """The model, with `tools` (each a ToolSpec.json_schema) offered on every call."""
        model = self._build(tools)
        if self.wrapper:
            model = resolve_model_wrapper(self.wrapper)(model)
        return model

    def _build(self, tools: list[dict[str, Any]]) -> Model:
        raise NotImplementedError

    def environment_problems(self) -> list[str]:
        """What the worker's environment lacks to build this model (checked at start-up)."""
        return []

    def spec(self) -> ModelSpec:
        raise NotImplementedError


class ScriptedConfig(_Common):
    provider: Literal["scripted"] = "scripted"
    script: list[ScriptTurn] = Field(min_length=1)

    def _build(self, tools: list[dict[str, Any]]) -> Model:
        return ScriptedModel(self.script)

    def spec(self) -> ModelSpec:
        return ModelSpec()


class _ProviderConfig(_Common):
    """Settings every real provider takes."""

    provider: str
    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_output_tokens: int | None = Field(default=None, gt=0)
    # One HTTP request to the provider; then the attempt fails as a timeout and is retried.
    request_timeout: PositiveDuration = timedelta(seconds=60)
    # Every attempt of one model call together, back-offs included; then the run fails.
    retry_budget: PositiveDuration = timedelta(minutes=10)
    extra_headers: dict[str, str] = {}

    sdk: ClassVar[str]  # the package the provider's module imports

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not an environment variable name (the key itself goes there)")
        return value

    @field_validator("extra_headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            malformed = malformed_references(text)
            if malformed:
                raise ValueError(f"header {name!r}: ${{{malformed[0]}}} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _budget_covers_an_attempt(self) -> _ProviderConfig:
        if self.retry_budget < self.request_timeout:
            raise ValueError(
                f"retry_budget ({self.retry_budget}) is shorter than request_timeout ({self.request_timeout})"
            )
        return self

    def environment_problems(self) -> list[str]:
        problems = []
        if importlib.util.find_spec(self.sdk) is None:
            problems.append(
                f"provider {self.provider} needs the {self.sdk!r} package: pip install 'onceflow[{self.sdk}]'"
            )
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            problems.append(
                f"model.api_key_env: the environment variable {self.api_key_env} is not set "
                "(set it to the provider's API key, or use api_key_env: null for a server without keys)"
            )
        for name in self.extra_headers:
            try:
                self._header(name)
            except UnsetVariableError as unset:
                problems.append(str(unset))
        return problems

    def api_key(self) -> str:
        """Read when the client is built, in the worker; never stored in anything that is sent."""
        if self.api_key_env is None:
            return KEYLESS_PLACEHOLDER
        key = os.environ.get(self.api_key_env)
        if not key:
            raise RuntimeError(f"the environment variable {self.api_key_env} is not set")
        return key

    def _header(self, name: str) -> str:
        return expand_variables(self.extra_headers[name], f"model.extra_headers.{name}")

    def headers(self) -> dict[str, str]:
        return {name: self._header(name) for name in self.extra_headers}

    def secrets(self) -> list[str]:
        """Everything read from the environment, so that error messages can be scrubbed of it."""
        found = [] if self.api_key_env is None else [self.api_key()]
        for text in self.extra_headers.values():
            found += [os.environ.get(name, "") for name in references(text)]
        return [value for value in found if value]

    def spec(self) -> ModelSpec:
        return ModelSpec(
            provider=self.provider,
            model=self.model,
            attempt_timeout_seconds=self.request_timeout.total_seconds(),
            retry_budget_seconds=self.retry_budget.total_seconds(),
        )


class OpenAIConfig(_ProviderConfig):
    """Chat Completions, from api.openai.com or any OpenAI-compatible server at `base_url`."""

    provider: Literal["openai"]
    api_key_env: str | None = "OPENAI_API_KEY"
    sdk = "openai"

    def _build(self, tools: list[dict[str, Any]]) -> Model:
        from onceflow.models.openai import OpenAIChatModel

        return OpenAIChatModel(self, tools)


class AnthropicConfig(_ProviderConfig):
    """The Messages API. Anthropic requires `max_tokens` on every request: `max_output_tokens`."""

    provider: Literal["anthropic"]
    api_key_env: str | None = "ANTHROPIC_API_KEY"
    temperature: float | None = Field(default=None, ge=0, le=1)
    max_output_tokens: int | None = Field(default=1024, gt=0)
    sdk = "anthropic"

    def _build(self, tools: list[dict[str, Any]]) -> Model:
        from onceflow.models.anthropic import AnthropicMessagesModel

        return AnthropicMessagesModel(self, tools)


def _provider_of(value: Any) -> str:
    # Files written before there were providers leave `provider` out: they meant the scripted one.
    if isinstance(value, dict):
        return str(value.get("provider", "scripted"))
    return str(getattr(value, "provider", "scripted"))


ModelConfig = Annotated[
    Annotated[ScriptedConfig, Tag("scripted")]
    | Annotated[OpenAIConfig, Tag("openai")]
    | Annotated[AnthropicConfig, Tag("anthropic")],
    Discriminator(
        _provider_of,
        custom_error_type="unknown_provider",
        custom_error_message="unknown provider (known: scripted, openai, anthropic)",
    ),
]
