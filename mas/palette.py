"""Named colours: how style feedback and prompts talk about palettes, and what they look like."""

from __future__ import annotations

import re

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (200, 30, 40),
    "crimson": (160, 20, 50),
    "orange": (240, 130, 30),
    "amber": (255, 180, 40),
    "yellow": (240, 220, 60),
    "gold": (212, 175, 55),
    "green": (40, 160, 70),
    "emerald": (20, 140, 90),
    "teal": (20, 130, 130),
    "cyan": (40, 200, 220),
    "blue": (30, 70, 200),
    "navy": (20, 30, 90),
    "purple": (110, 40, 160),
    "violet": (140, 80, 200),
    "magenta": (200, 40, 160),
    "pink": (240, 140, 180),
    "white": (240, 240, 240),
    "silver": (190, 190, 200),
    "grey": (120, 120, 120),
    "gray": (120, 120, 120),
    "black": (15, 15, 20),
    "brown": (110, 70, 40),
}
NEUTRAL = [(120, 120, 120), (60, 60, 60), (180, 180, 180)]


def colors_in(text: str) -> list[str]:
    """Colour names in `text`, in order, once each."""
    return list(dict.fromkeys(w for w in re.findall(r"[a-z]+", text.lower()) if w in COLORS))


def palette_of(text: str) -> list[tuple[int, int, int]]:
    """The RGB palette a prompt asks for (neutral greys when it names no colour)."""
    return [COLORS[c] for c in colors_in(text)] or NEUTRAL
