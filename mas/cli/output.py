"""How commands show things: memory blocks as tables, file paths whole on lines of their own."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rich.table import Table

from mas.cli.context import console
from mas.config import Settings
from mas.errors import StudioError
from mas.storage import local_copy


def print_whole(text: str) -> None:
    """One line never wrapped, cut or coloured by the console, so a path in it can be copied."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def print_files(settings: Settings, videos: Iterable) -> None:
    """Each video's file on this host, whole (tables fold or cut long paths): a bucket's object is
    downloaded once into this host's cache; a file this host cannot reach says so."""
    for video in videos:
        if video.output_path:
            try:
                path = local_copy(settings, video.output_path)
            except StudioError as exc:
                print_whole(f"video {video.id}: {video.output_path} (not readable here: {exc})")
                continue
            shown = str(path) if path is not None else f"{video.output_path} (not found on this host)"
            print_whole(f"video {video.id}: {shown}")


def print_block(label: str, value: dict) -> None:
    table = Table("field", "value", title=label)
    for field, v in value.items():
        table.add_row(field, v if isinstance(v, str) else json.dumps(v))
    console.print(table)
