"""Who a request is from and whose work it may touch: the identity the gate (`mas.accounts.gate`) proved from
the credential, the `Actor` a request's work is done for, and the one settings object of the process. Routes
never take the acting user from the body; what a caller may see is `mas.accounts.visibility.visible`."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from mas.accounts.gate import SCOPE_KEY
from mas.config import Settings
from mas.domain.identity import Actor, Identity
from mas.errors import Unauthorized


def identity_of(connection: HTTPConnection) -> Identity:
    """Who the request's credential proved (set by the gate before any route runs; none set is refused)."""
    identity = connection.scope.get(SCOPE_KEY)
    if not isinstance(identity, Identity):
        raise Unauthorized("the request carries no proven credential")
    return identity


def actor_of(connection: HTTPConnection, named: str | None = None) -> Actor:
    """The user the request acts for: the caller, or a user an admin names."""
    return identity_of(connection).actor(named)


def settings_of(connection: HTTPConnection) -> Settings:
    """The process's settings: the same for every caller."""
    settings: Settings = connection.app.state.settings
    return settings
