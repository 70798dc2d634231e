"""What a caller may see, as the filter every listing and fetch applies: the API's routes and event streams, the
gallery's pages and buttons. One rule (`mas.domain.identity.Identity.scope`): admins see everyone's work,
members their own; another user's thing is not found, exactly as one that does not exist."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import InstrumentedAttribute

from mas.domain.identity import Identity
from mas.memory.blocks import PER_USER


def visible(identity: Identity, owner: InstrumentedAttribute[str], named: str | None = None) -> sa.ColumnElement[bool]:
    """The condition on a query's `owner` column (a row's `user_name`) that keeps what `identity` may see:
    everything for an admin naming no one, else one user's rows (`Identity.scope`)."""
    who = identity.scope(named)
    return sa.true() if who is None else owner == who


def visible_blocks(identity: Identity, everything: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The core blocks `identity` may read: an admin all of them, a member their own taste blocks only (the
    studio's shared blocks speak of everyone's work)."""
    return everything if identity.is_admin else {label: v for label, v in everything.items() if label in PER_USER}
