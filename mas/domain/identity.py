"""Who acts: the identity a request's credential proves, and what it may see and do.

The studio never takes who acts from a field the client fills in: the gate works out an `Identity` from the
credential (an API key, a gallery login, the operator's token), and every route asks it whose work a request
is for and whether a thing it names is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mas.errors import PermanentError

Role = Literal["admin", "member"]
ROLES: tuple[Role, ...] = ("admin", "member")


class ActsForOthers(PermanentError, PermissionError):
    """A member named another user: members act only for themselves."""


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

    def sees(self, owner: str) -> bool:
        """Whether a thing owned by `owner` exists as far as this caller is concerned."""
        return self.is_admin or owner == self.name
