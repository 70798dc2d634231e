"""One error tree for the whole studio.

Every error the studio raises on purpose derives from `StudioError`, and says through its branch whether
trying again can help:

- `RetryableError`: the world may change (a peer refused the connection, answered 5xx or timed out, the
  database is restarting, another run holds the lock). Steps back off and try again.
- `PermanentError`: the same call will fail the same way (rejected input, a missing model, invalid
  settings, an agent reply still wrong after its retries). Steps end at once with the reason recorded.

Families of one subsystem (`LettaError`, `ComfyUIError`, ...) subclass `StudioError` and mix in one of the
two branches per leaf, so callers can catch either the family or the branch. The CLI catches
`StudioError` once and prints its message; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class StudioError(Exception):
    """Root of every error the studio raises on purpose; its message is meant for a person."""

    #: Whether trying the same thing again can succeed. Set by the two branches below.
    retryable: bool = False


class RetryableError(StudioError):
    """Transient: a later try of the same thing can succeed."""

    retryable = True


class PermanentError(StudioError):
    """Final: the same call fails the same way until a person changes something."""

    retryable = False


class InvalidInput(PermanentError, ValueError):
    """Input refused at the edge (a request, a block value, a pick, a URL); nothing was written."""


class InvalidSettings(PermanentError):
    """A setting that cannot work (say which, and what would)."""


class PeerUnavailable(RetryableError, ConnectionError):
    """A server the studio talks to could not be reached, timed out or answered 5xx."""


class Unauthorized(PermanentError):
    """The credential is missing, unknown, revoked or expired: nothing was done."""
