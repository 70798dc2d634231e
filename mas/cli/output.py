"""How commands show things: memory blocks as tables, file paths whole on lines of their own."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rich.table import Table

from mas.cli.context import console


def print_whole(text: str) -> None:
    """One line never wrapped, cut or coloured by the console, so a path in it can be copied."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def print_files(videos: Iterable) -> None:
    """Each video's file, whole (tables fold or cut long paths)."""
    for video in videos:
        if video.output_path:
            print_whole(f"video {video.id}: {video.output_path}")


def print_block(label: str, value: dict) -> None:
    table = Table("field", "value", title=label)
    for field, v in value.items():
        table.add_row(field, v if isinstance(v, str) else json.dumps(v))
    console.print(table)
