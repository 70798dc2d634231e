"""What can go wrong with the llm backend, each leaf on the branch of `mas.errors` it belongs to."""

from __future__ import annotations

from mas.agents.replies import NoValidReply
from mas.errors import InvalidSettings, PeerUnavailable, PermanentError, StudioError


class LLMError(StudioError):
    """The chat endpoint or a model reply went wrong; the message says what to do."""


class LLMUnavailable(LLMError, PeerUnavailable):
    """The endpoint could not be reached, timed out (a reply that never ended), was busy or answered 5xx."""


class LLMMisconfigured(LLMError, InvalidSettings):
    """The endpoint refused the API key, or knows no such model."""


class LLMRejected(LLMError, PermanentError):
    """The endpoint refused the request itself (a 4xx other than the transient ones)."""


class LLMReplyError(LLMError, NoValidReply, PermanentError):
    """A reply still malformed after the model was shown its mistakes `MAS_LLM_REPLY_RETRIES` times."""
