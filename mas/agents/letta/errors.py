"""What can go wrong with the Letta backend, each leaf on the branch of `mas.errors` it belongs to."""

from __future__ import annotations

from mas.errors import InvalidSettings, PeerUnavailable, PermanentError, RetryableError, StudioError


class LettaError(StudioError):
    """Something about the Letta server or its agents went wrong; the message says what to do."""


class LettaUnavailable(LettaError, PeerUnavailable):
    """The server could not be reached, timed out, was busy or answered with a server error."""


class LettaMisconfigured(LettaError, InvalidSettings):
    """The studio cannot talk to Letta as configured: letta-client missing, or the token refused."""


class LettaRejected(LettaError, PermanentError):
    """The server refused a request (a 4xx other than the transient ones), or did not do what it said."""


class LettaNotFound(LettaRejected):
    """An agent or block the studio asked for is not on the server (deleted behind the studio's back)."""


class LettaReplyError(LettaError, RetryableError):
    """An agent's reply held no JSON object of the shape its task asked for (a retry may answer better)."""

    def __init__(self, *, agent: str, task: str, problem: str, excerpt: str = "") -> None:
        self.agent, self.task, self.problem, self.excerpt = agent, task, problem, excerpt
        detail = f": {excerpt!r}" if excerpt else ""
        super().__init__(f"{agent} answered task {task!r} with {problem}{detail}")

    def __reduce__(self):  # picklable with its keyword-only constructor (Celery ships exceptions)
        return (_rebuild_reply_error, (self.agent, self.task, self.problem, self.excerpt))

    def __repr__(self) -> str:
        return f"LettaReplyError(agent={self.agent!r}, task={self.task!r}, problem={self.problem!r})"


def _rebuild_reply_error(agent: str, task: str, problem: str, excerpt: str) -> LettaReplyError:
    return LettaReplyError(agent=agent, task=task, problem=problem, excerpt=excerpt)
