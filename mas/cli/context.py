"""What every command shares: one console, the settings, and the services brought up before work."""

from __future__ import annotations

from pydantic import ValidationError
from rich.console import Console

from mas import db, services
from mas.config import Settings
from mas.errors import InvalidSettings

console = Console()


def load_settings() -> Settings:
    """The settings from the environment, or the first invalid one named as its MAS_ variable."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        where = f"MAS_{field.upper()}" if field else "settings"
        raise InvalidSettings(f"invalid {where}: {first['msg']}") from None


def ready(settings: Settings) -> None:
    """Start the embedded services if they are ours, then check and migrate the database."""
    services.up(settings)
    db.ready_engine(settings)
