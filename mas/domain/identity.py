"""Who acts: the identity a request's credential proves, what it may see, and the user work is done for.

The studio never takes who acts from a field the client fills in: the gate works out an `Identity` from the
credential (an API key, a gallery login, the operator's token), and every route asks it whose work a request
is for (`Identity.actor`) and whose work it may see (`Identity.scope`, the one visibility rule). Every service
that acts for someone takes the `Actor` explicitly, as a workflow engine hands an activity its context: a
command's `--user`, the caller the gate proved, or the user a batch was made for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from mas.config import USER_PATTERN
from mas.errors import InvalidInput, PermanentError

Role = Literal["admin", "member"]
ROLES: tuple[Role, ...] = ("admin", "member")

DEFAULT_USER = "default"
"""The user of work and picks when no `--user` / MAS_USER names one; the studio default taste."""


class ActsForOthers(PermanentError, PermissionError):
    """A member named another user: members act only for themselves."""


@dataclass(frozen=True)
class Actor:
    """The user a piece of work is done for: whose taste it reads and teaches, whose quotas count it, whose GPU
    share and webhook secret apply. Settings say how the studio runs, the same for everyone; this says for whom."""

    user: str

    def __post_init__(self) -> None:
        if not re.fullmatch(USER_PATTERN, self.user):
            raise InvalidInput(f"user name {self.user!r}: use letters, digits, '_', '.' or '-', at most 40 characters")


STUDIO = Actor(DEFAULT_USER)
"""The studio's own work (its shared blocks, beat jobs that belong to no batch): the default user."""


@dataclass(frozen=True, kw_only=True)
class Identity:
    """A caller proven by its credential. An admin sees everyone's work and acts for a user it names; a
    member sees and acts on their own only."""

    name: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def acts_for(self, named: str | None) -> str:
        """The user a request is for: the caller, or (an admin only) the user it names."""
        if named is None or named == self.name:
            return self.name
        if not self.is_admin:
            raise ActsForOthers(f"{self.name} may act only for themselves, not for another user")
        return named

    def actor(self, named: str | None = None) -> Actor:
        """The `Actor` a request's work is done for (`acts_for`)."""
        return Actor(self.acts_for(named))

    def scope(self, named: str | None = None) -> str | None:
        """THE visibility rule: whose work this caller's listings and fetches show. None: everyone's (an admin
        naming no one); else one user's (a member's own, or the user an admin names). A member naming another
        user is refused. `mas.accounts.visibility.visible` is this rule as the filter of a query."""
        if named is None and self.is_admin:
            return None
        return self.actor(named).user  # a name that names no user is refused
