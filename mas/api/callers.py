"""Who a request is from and whose work it may touch: the identity the gallery's gate proved from the
credential, and the settings of the user a request acts for. Routes never take the acting user from the body."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from mas.config import Settings
from mas.domain.identity import Identity
from mas.errors import Unauthorized

SCOPE_KEY = "mas.identity"


def identity_of(connection: HTTPConnection) -> Identity:
    """Who the request's credential proved (set by the gate before any route runs; none set is refused)."""
    identity = connection.scope.get(SCOPE_KEY)
    if not isinstance(identity, Identity):
        raise Unauthorized("the request carries no proven credential")
    return identity


def acting(connection: HTTPConnection, named: str | None = None) -> Settings:
    """The settings of the user the request acts for: the caller, or a user an admin names."""
    settings: Settings = connection.app.state.settings
    return settings.for_user(identity_of(connection).acts_for(named))


def sees(connection: HTTPConnection, owner: str) -> bool:
    """Whether the caller may see a thing `owner` owns (an admin sees everyone's)."""
    return identity_of(connection).sees(owner)
