"""The studio's credentials as stored: an API key's secret by its SHA-256 (a key is 256 random bits, so a fast
hash is as strong as the key), a login password by scrypt (a person's password is guessable, so its hash is
slow on purpose). Nothing here reads or writes the database."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass

KEY_PREFIX = "mas_"
KEY_PATTERN = re.compile(r"mas_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
"""`mas_<key id>_<secret>`: the key id is public (listed, revoked by), the secret is only ever shown once."""

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1  # 16 MiB and some tens of milliseconds per check
MIN_PASSWORD_CHARS = 12


@dataclass(frozen=True)
class NewKey:
    key_id: str
    secret_hash: str
    key: str  # shown to the operator once, never stored


def new_key() -> NewKey:
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return NewKey(key_id=key_id, secret_hash=hash_secret(secret), key=f"{KEY_PREFIX}{key_id}_{secret}")


def split_key(key: str) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed key, else None."""
    match = KEY_PATTERN.fullmatch(key)
    return (match.group(1), match.group(2)) if match else None


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    return secrets.compare_digest(hash_secret(secret), stored_hash)


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def password_matches(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        given = hashlib.scrypt(
            password.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(base64.b64decode(digest)),
        )
    except ValueError:
        return False
    return secrets.compare_digest(_b64(given), digest)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


DUMMY_HASH = hash_password(secrets.token_urlsafe(16))
"""Checked against when the user is unknown, so an unknown name costs as long as a wrong password."""
