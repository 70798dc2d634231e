"""User text made safe: to show (control characters made visible) and to store (what PostgreSQL refuses,
refused first, with the name of what carried it).

A request, a memory value or a failure reason may hold anything a user or a peer typed: escape sequences a
terminal would obey, a bell, NUL bytes, lone surrogates (from a JSON escape such as "\\ud800", or from
command-line bytes that were not UTF-8, which Python decodes as surrogates). The studio shows such text as
text and refuses to store what the database cannot hold, before writing anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
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


def check_utf8(text: str, what: str) -> None:
    """Refuse text decoded from bytes that were not UTF-8 (a command-line argument: Python keeps each such
    byte as a surrogate), naming `what` it was and the first bad byte."""
    bad = SURROGATE.search(text)
    if bad:
        code = ord(bad.group())
        byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise InvalidInput(
            f"{what} is not valid UTF-8 text ({byte} at character {bad.start() + 1} is from "
            "another encoding); convert it to UTF-8"
        )


def _strings(value: Any) -> Iterator[str]:
    """Every string inside `value`: itself, or the keys and items of JSON lists and objects."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def check_unicode(value: Any, what: str) -> None:
    """Refuse a lone surrogate anywhere inside `value`: it is not a Unicode character, so it cannot be
    encoded as UTF-8 (not by PostgreSQL, not by a tokenizer), naming `what` it was."""
    for text in _strings(value):
        bad = SURROGATE.search(text)
        if bad:
            raise InvalidInput(
                f"{what} contains a lone surrogate (U+{ord(bad.group()):04X}), which is not a "
                "valid Unicode character; remove it"
            )


def check_storable(value: Any, what: str) -> None:
    """Refuse text PostgreSQL cannot store (NUL, lone surrogates) anywhere inside `value` (a string, or JSON
    lists and objects of them), naming `what` it was."""
    if any("\x00" in text for text in _strings(value)):
        raise InvalidInput(f"{what} contains a NUL character, which cannot be stored; remove it")
    check_unicode(value, what)


EDGE_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""The control characters no field a client sends may hold: NUL and the other C0 controls but tab and line
breaks, and DEL."""


def check_plain(text: str, what: str) -> str:
    """Refuse text a client sent with a control character or a lone surrogate, naming `what` it was and where:
    no field of the studio means one, PostgreSQL cannot store NUL, and a terminal would obey the rest. Returns
    `text` (a validator of the API's bodies)."""
    bad = EDGE_CONTROL.search(text) or SURROGATE.search(text)
    if bad:
        raise InvalidInput(
            f"{what} contains U+{ord(bad.group()):04X} at character {bad.start() + 1}, a control character or a "
            "lone surrogate, which no field takes; remove it"
        )
    return text
