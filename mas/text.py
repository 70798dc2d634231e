"""User text made safe: to show (control characters made visible) and to store (what PostgreSQL refuses,
refused first, with the name of what carried it).

A request, a memory value or a failure reason may hold anything a user or a peer typed: escape sequences a
terminal would obey, a bell, NUL bytes, halves of a surrogate pair from bytes that were not UTF-8. The
studio shows such text as text and refuses to store what the database cannot hold, before writing anything.
"""

from __future__ import annotations

import re
from typing import Any

from mas.errors import InvalidInput

# C0 and C1 controls but tab and newline, DEL, and the invisible format characters that reorder or hide text
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
SURROGATE = re.compile(r"[\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every control or invisible character written out (ESC becomes \\x1b), so a terminal
    shows it rather than obeys it."""
    return SURROGATE.sub(_escape, CONTROL.sub(_escape, text))


def check_storable(value: Any, what: str) -> None:
    """Refuse text PostgreSQL cannot store (NUL; lone surrogates, which come from bytes that are not UTF-8),
    anywhere inside `value` (a string, or JSON lists and objects of them), naming `what` it was."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidInput(f"{what} contains a NUL character, which cannot be stored; remove it")
        if SURROGATE.search(value):
            raise InvalidInput(
                f"{what} is not valid UTF-8 text (it came from bytes in another encoding); convert it to UTF-8"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            check_storable(key, what)
            check_storable(item, what)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_storable(item, what)
