"""Users and their credentials in PostgreSQL: made, listed and revoked by the operator (`mas users`), and
checked by the gallery's gate on every request."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from mas.accounts import secrets as stored
from mas.config import USER_PATTERN, Settings, check_webhook_secret
from mas.db import session_scope
from mas.domain.fair_share import check_share
from mas.domain.identity import ROLES, Identity, Role
from mas.errors import InvalidInput
from mas.models import ApiKey, User

MAX_REMEMBERED = 1000


class UnknownUser(InvalidInput):
    """No user by that name (or no such key of theirs)."""


QUOTAS = ("videos_per_day", "videos_waiting", "batches_at_once")
"""A user's own quotas (None: the studio's default, MAS_QUOTA_*), counted by `mas.pipeline.quotas`."""

LIMITS = ("gpu_share", *QUOTAS, "webhook_secret")
"""What `set_limits` changes."""

MAX_QUOTA = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class UserRow:
    name: str
    role: str
    keys: int  # keys in force: neither revoked nor expired
    login: bool
    created_at: datetime
    gpu_share: float = 1.0
    videos_per_day: int | None = None  # their own quotas; None: the studio's default
    videos_waiting: int | None = None
    batches_at_once: int | None = None
    webhook_secret: bool = False  # whether they have their own (never shown)

    @classmethod
    def of(cls, user: User, keys: int) -> UserRow:
        return cls(
            name=user.name,
            role=user.role,
            keys=keys,
            login=user.password_hash is not None,
            created_at=user.created_at,
            gpu_share=user.gpu_share,
            videos_per_day=user.videos_per_day,
            videos_waiting=user.videos_waiting,
            batches_at_once=user.batches_at_once,
            webhook_secret=user.webhook_secret is not None,
        )


def _now() -> datetime:
    return datetime.now(UTC)


def _check_name(name: str) -> None:
    if not re.fullmatch(USER_PATTERN, name):
        raise InvalidInput(f"user name {name!r}: use letters, digits, '_', '.' or '-', at most 40 characters")


def add(settings: Settings, name: str, *, role: Role = "member", expires_in: timedelta | None = None) -> str:
    """Make the user with a first API key; return the key (shown once: only its hash is kept)."""
    _check_name(name)
    if role not in ROLES:
        raise InvalidInput(f"role {role!r}: use one of {', '.join(ROLES)}")
    with session_scope(settings) as session:
        if session.get(User, name) is not None:
            raise InvalidInput(f"there is already a user {name!r}; `mas users keys {name}` gives them another key")
        session.add(User(name=name, role=role))
        session.flush()
        return _add_key(session, name, expires_in)


def new_key(settings: Settings, name: str, *, expires_in: timedelta | None = None) -> str:
    """Another API key for the user (their others stay valid until revoked)."""
    with session_scope(settings) as session:
        if session.get(User, name) is None:
            raise UnknownUser(f"there is no user {name!r}")
        return _add_key(session, name, expires_in)


def _add_key(session, name: str, expires_in: timedelta | None) -> str:
    if expires_in is not None and expires_in <= timedelta(0):
        raise InvalidInput("a key's lifetime must be positive")
    key = stored.new_key()
    expires_at = None if expires_in is None else _now() + expires_in
    session.add(ApiKey(key_id=key.key_id, user_name=name, secret_hash=key.secret_hash, expires_at=expires_at))
    return key.key


def set_password(settings: Settings, name: str, password: str) -> None:
    """The user's gallery login (basic auth with their name and this password)."""
    if len(password) < stored.MIN_PASSWORD_CHARS:
        raise InvalidInput(f"a password needs at least {stored.MIN_PASSWORD_CHARS} characters")
    with session_scope(settings) as session:
        user = session.get(User, name)
        if user is None:
            raise UnknownUser(f"there is no user {name!r}")
        user.password_hash = stored.hash_password(password)


def revoke(settings: Settings, name: str, key_id: str | None = None) -> int:
    """Revoke every key of the user and their login, or the one key `key_id`; return how many keys."""
    with session_scope(settings) as session:
        user = session.get(User, name)
        if user is None:
            raise UnknownUser(f"there is no user {name!r}")
        keys = sa.update(ApiKey).where(ApiKey.user_name == name, ApiKey.revoked_at.is_(None)).values(revoked_at=_now())
        if key_id is not None:
            keys = keys.where(ApiKey.key_id == key_id)
        revoked = session.execute(keys.returning(ApiKey.key_id)).scalars().all()
        if key_id is not None and not revoked:
            raise UnknownUser(f"{name} has no key {key_id!r} in force")
        if key_id is None:
            user.password_hash = None
        return len(revoked)


def set_limits(settings: Settings, name: str, changes: Mapping[str, object]) -> UserRow:
    """Change the user's GPU share, quotas or webhook secret: each of `LIMITS` named in `changes` (None: a
    quota back to the studio's default, or no webhook secret of their own); the others stay. All are checked
    before any is written."""
    if not changes:
        raise InvalidInput("nothing to change: give a share, a quota or a webhook secret")
    if unknown := sorted(set(changes) - set(LIMITS)):
        raise InvalidInput(f"no limit is named {', '.join(unknown)}; they are {', '.join(LIMITS)}")
    checked = {field: _checked(field, value) for field, value in changes.items()}
    with session_scope(settings) as session:
        user = session.get(User, name)
        if user is None:
            raise UnknownUser(f"there is no user {name!r}")
        for field, value in checked.items():
            setattr(user, field, value)
        session.flush()
        return UserRow.of(user, _keys_in_force(session, name))


def _checked(field: str, value: object) -> object:
    if field == "gpu_share":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(f"a GPU share is a number above 0, got {value!r}")
        return check_share(float(value))
    if field == "webhook_secret":
        if value is None:
            return None
        if not isinstance(value, str):
            raise InvalidInput("a webhook secret is text: whsec_ and base64")
        try:
            return check_webhook_secret(value, "a user's webhook secret")
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUOTA:
        raise InvalidInput(
            f"a quota ({field.replace('_', ' ')}) is a whole number from 0 to {MAX_QUOTA}, got {value!r}"
        )
    return value


def _in_force() -> sa.ColumnElement[bool]:
    return sa.and_(ApiKey.revoked_at.is_(None), sa.or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > sa.func.now()))


def _keys_in_force(session, name: str) -> int:
    return session.scalar(sa.select(sa.func.count()).where(ApiKey.user_name == name, _in_force())) or 0


def listed(settings: Settings) -> list[UserRow]:
    keys = sa.select(sa.func.count()).where(ApiKey.user_name == User.name, _in_force()).scalar_subquery()
    with session_scope(settings) as session:
        rows = session.execute(sa.select(User, keys).order_by(User.name)).all()
        return [UserRow.of(user, n) for user, n in rows]


def any_users(settings: Settings) -> bool:
    with session_scope(settings) as session:
        return session.scalar(sa.select(sa.exists().select_from(User))) or False


def by_key(settings: Settings, key: str) -> Identity | None:
    """The identity an API key proves, or None (malformed, unknown, revoked or expired)."""
    parts = stored.split_key(key)
    if parts is None:
        return None
    key_id, secret = parts
    with session_scope(settings) as session:
        row = session.execute(
            sa.select(ApiKey, User.role).join(User, User.name == ApiKey.user_name).where(ApiKey.key_id == key_id)
        ).first()
    if row is None or not stored.secret_matches(secret, row[0].secret_hash):
        return None
    api_key, role = row
    if api_key.revoked_at is not None or (api_key.expires_at is not None and api_key.expires_at <= _now()):
        return None
    return Identity(name=api_key.user_name, role=_role(role))


def by_login(settings: Settings, name: str, password: str, verified: set[str] | None = None) -> Identity | None:
    """The identity a gallery login proves, or None; as slow for an unknown name as for a wrong password.

    `verified` remembers logins already checked against the stored hash (a browser sends the login with
    every request, and scrypt is slow on purpose): a changed or revoked password no longer matches."""
    with session_scope(settings) as session:
        user = session.get(User, name) if re.fullmatch(USER_PATTERN, name) else None
        role, hashed = (user.role, user.password_hash) if user is not None else (None, None)
    if role is None or hashed is None:
        stored.password_matches(password, stored.DUMMY_HASH)
        return None
    seen = hashlib.sha256("\0".join((name, password, hashed)).encode()).hexdigest()
    if verified is None or seen not in verified:
        if not stored.password_matches(password, hashed):
            return None
        if verified is not None:
            if len(verified) > MAX_REMEMBERED:
                verified.clear()
            verified.add(seen)
    return Identity(name=name, role=_role(role))


def _role(stored_role: str) -> Role:
    """A stored role as the type; an unknown one (written by hand) gets a member's rights, never more."""
    return "admin" if stored_role == "admin" else "member"
