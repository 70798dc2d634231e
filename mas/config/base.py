"""What every settings group shares: the `Group` base, its pydantic configuration, and the checks and
parsers of values that several groups use."""

from __future__ import annotations

import ipaddress
import json
from typing import Any
from urllib.parse import urlsplit

from pydantic_settings import BaseSettings, SettingsConfigDict

from mas.redaction import redact_url

USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$"
"""A user name: letters, digits, `_`, `.`, `-`, at most 40 characters (it names rows and memory blocks)."""


def split_url(url: str):
    """urlsplit, with a port checked, raising ValueError that never repeats the URL (it may hold a password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises for a port that is not 0-65535)
    except ValueError:
        raise ValueError(
            f"cannot read the URL {redact_url(url)!r} (a bad port, or brackets that do not close)"
        ) from None
    return parts


def is_loopback(host: str) -> bool:
    """True for "localhost" and any loopback address (127.0.0.0/8, ::1): where no auth is needed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_url(value: str) -> str:
    parts = split_url(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL with a host, got {redact_url(value)!r}")
    return value


def comma_list(value: object) -> object:
    """A list setting as the environment or .env gives it: comma-separated text, split here (blanks dropped)."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


def parse_json(value: object) -> object:
    """A JSON setting as the environment or .env gives it: text, parsed here."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at character {exc.pos + 1}") from None


# hide_input_in_errors: a refused value may be a URL holding a password; errors name the variable only.
# enable_decoding=False: JSON values are parsed by `parse_json`, so a value that does not parse is a validation error
# of its field, named as its MAS_ variable like any other. extra="ignore": a .env holds every group's variables.
CONFIG = SettingsConfigDict(
    env_file=".env", extra="ignore", hide_input_in_errors=True, enable_decoding=False, validate_by_name=True
)


def _refuse_unknown(model: type[BaseSettings], values: dict[str, Any]) -> None:
    """A value given by a name the model does not have is a mistake, not something to ignore quietly."""
    known = set(model.model_fields) | {f.validation_alias for f in model.model_fields.values()}
    if unknown := sorted(set(values) - known):
        raise TypeError(f"{model.__name__} has no setting {', '.join(unknown)}; it has {', '.join(model.model_fields)}")


class Group(BaseSettings):
    """A group of settings of one concern; each field reads the MAS_ variable its alias names."""

    model_config = CONFIG

    def __init__(self, **values: Any) -> None:
        _refuse_unknown(type(self), values)
        super().__init__(**values)

    def env_names(self) -> dict[str, str]:
        """Each field's MAS_ variable."""
        return {name: str(field.validation_alias) for name, field in type(self).model_fields.items()}

    def by_variable(self) -> dict[str, Any]:
        """Each value by its MAS_ variable."""
        return {env: getattr(self, name) for name, env in self.env_names().items()}
