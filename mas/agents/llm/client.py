"""One chat completion against an OpenAI-compatible endpoint, with the reply constrained to a schema.

The `openai` client speaks to vLLM, llama.cpp's server, Ollama's /v1 and hosted APIs alike. Endpoints
differ in how they constrain a reply, so the mode is a setting (`MAS_LLM_STRUCTURED`); `auto` tries the
standard `response_format: json_schema` first, then a forced tool call, then instructions alone, and
remembers per process what the endpoint accepted. Whatever the mode, the studio validates the reply itself.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletionMessageParam

from mas.agents.llm.errors import LLMMisconfigured, LLMRejected, LLMUnavailable
from mas.config import Settings
from mas.redaction import redact_url
from mas.singletons import per_process

log = logging.getLogger(__name__)

AUTO_ORDER = ("json_schema", "tools", "prompt")
"""What `auto` tries, best first."""

REPLY_TOOL = "reply"
"""The function a `tools`-mode call forces the model to call; its arguments are the reply."""


@dataclass(frozen=True, kw_only=True)
class Completion:
    """A model's answer: its text (the JSON the reply should be), token counts and how it was constrained."""

    text: str
    truncated: bool  # the reply stopped at MAS_LLM_MAX_TOKENS, not at its end
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, served from the endpoint's prompt cache (0 where not reported)
    completion_tokens: int
    mode: str


@per_process(key=lambda url, key, timeout: (url, key, timeout))
def _api(url: str, key: str, timeout: float) -> openai.OpenAI:
    # retries are the studio's (Celery's backoff for the retryable branch), never hidden in the client
    return openai.OpenAI(base_url=url, api_key=key or "not-needed", timeout=timeout, max_retries=0)


@per_process(key=lambda url, model: (url, model))
def _accepted(url: str, model: str) -> list[str]:  # noqa: ARG001
    """The mode `auto` found this endpoint accepts (empty until found), remembered per process."""
    return []


def complete(
    settings: Settings,
    messages: list[dict[str, Any]],
    *,
    schema: dict[str, Any],
    name: str,
    max_tokens: int | None = None,
) -> Completion:
    """The model's reply to `messages`, constrained to `schema` as far as the endpoint allows, in at most
    `max_tokens` (and never more than MAS_LLM_MAX_TOKENS)."""
    limit = min(max_tokens or settings.llm.max_tokens, settings.llm.max_tokens)
    if settings.llm.structured != "auto":
        return _call(settings, messages, schema=schema, name=name, mode=settings.llm.structured, limit=limit)
    accepted = _accepted(settings.llm.url, settings.llm.model)
    if accepted:
        return _call(settings, messages, schema=schema, name=name, mode=accepted[0], limit=limit)
    *constrained, last = AUTO_ORDER
    for mode in constrained:
        try:
            completion = _call(settings, messages, schema=schema, name=name, mode=mode, limit=limit)
        except LLMRejected as error:
            log.info("llm endpoint %s refused %s replies (%s); trying the next mode", _where(settings), mode, error)
            continue
        accepted[:] = [mode]
        return completion
    completion = _call(settings, messages, schema=schema, name=name, mode=last, limit=limit)  # its refusal is its own
    accepted[:] = [last]
    return completion


def _call(
    settings: Settings, messages: list[dict[str, Any]], *, schema: dict[str, Any], name: str, mode: str, limit: int
) -> Completion:
    key = settings.llm.api_key.get_secret_value() if settings.llm.api_key else ""
    api = _api(settings.llm.url, key, settings.llm.timeout_seconds)
    extra: dict[str, Any] = {}
    if mode == "json_schema":
        extra["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    elif mode == "json_object":  # llama.cpp's extension: a schema beside json_object
        extra["response_format"] = {"type": "json_object", "schema": schema}
    elif mode == "tools":
        extra["tools"] = [
            {
                "type": "function",
                "function": {"name": REPLY_TOOL, "description": f"the {name} reply", "parameters": schema},
            }
        ]
        extra["tool_choice"] = {"type": "function", "function": {"name": REPLY_TOOL}}
    wire = cast(list[ChatCompletionMessageParam], messages)  # plain role/content dicts, the API's own shape
    try:
        response = api.chat.completions.create(
            model=settings.llm.model,
            messages=wire,
            max_tokens=limit,
            temperature=settings.llm.temperature,
            **extra,
        )
    except openai.APITimeoutError:
        raise LLMUnavailable(
            f"the LLM at {_where(settings)} gave no reply within {settings.llm.timeout_seconds:g} s "
            "(MAS_LLM_TIMEOUT_SECONDS)"
        ) from None
    except openai.APIConnectionError as error:
        raise LLMUnavailable(f"cannot reach the LLM at {_where(settings)}: {_cause(error)}") from None
    except openai.APIStatusError as error:
        raise _status_error(settings, error, mode) from None
    return _completion(response, mode, limit)


def _completion(response: Any, mode: str, limit: int) -> Completion:
    choice = response.choices[0] if response.choices else None
    text = ""
    if choice is not None:
        calls = getattr(choice.message, "tool_calls", None) or []
        if mode == "tools" and calls:  # noqa: SIM108
            text = calls[0].function.arguments or ""
        else:
            text = choice.message.content or ""
    usage = response.usage
    completion_tokens = getattr(usage, "completion_tokens", 0) or 0
    return Completion(
        text=text,
        mode=mode,
        # a forced tool call ends "tool_calls" even when the token limit cut it (llama.cpp): count, too
        truncated=choice is not None and (choice.finish_reason == "length" or completion_tokens >= limit),
        prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        cached_tokens=getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", 0) or 0,
        completion_tokens=completion_tokens,
    )


def _status_error(settings: Settings, error: openai.APIStatusError, mode: str) -> Exception:
    status = error.status_code
    detail = _body(error)
    where = _where(settings)
    if status in (401, 403):
        return LLMMisconfigured(f"the LLM at {where} refused the API key (HTTP {status}); check MAS_LLM_API_KEY")
    if status == 404 and "model" in detail.lower():
        return LLMMisconfigured(f"the LLM at {where} has no model {settings.llm.model!r} (MAS_LLM_MODEL): {detail}")
    if status in (408, 409, 425, 429) or status >= 500:
        if status == 500 and mode != "prompt" and settings.llm.structured == "auto" and _about_format(detail):
            return LLMRejected(f"HTTP {status} for {mode} replies: {detail}")
        return LLMUnavailable(f"the LLM at {where} answered HTTP {status}: {detail}")
    return LLMRejected(f"the LLM at {where} refused the request (HTTP {status}): {detail}")


def _about_format(detail: str) -> bool:
    """Some servers answer 500 to a reply format they cannot do; auto then tries the next mode."""
    lowered = detail.lower()
    return any(word in lowered for word in ("response_format", "json_schema", "tool", "grammar", "schema"))


def _body(error: openai.APIStatusError) -> str:
    try:
        body = error.response.json()
    except (ValueError, json.JSONDecodeError):
        return (error.response.text or "")[:200]
    message = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(message, dict):
        message = message.get("message", message)
    return str(message)[:200]


def _cause(error: BaseException) -> str:
    while error.__cause__ is not None:
        error = error.__cause__
    return str(error) or type(error).__name__


def _where(settings: Settings) -> str:
    return redact_url(settings.llm.url) or ""
