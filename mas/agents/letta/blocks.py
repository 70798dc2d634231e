"""The six core blocks as the Letta server keeps them, and how they follow the studio's copy.

The studio's source of truth is PostgreSQL (`mas.memory.blocks`); every Letta agent carries the six
blocks in its core memory, so the server's copies must say the same before an agent reads them.
`push_studio_blocks` runs before each role call and writes only the blocks whose studio value changed
since this process last pushed them (one query, no server call when nothing changed). Between pushes
the sleeptime companions may edit the server's copies; the studio's next change of a block wins.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from pydantic import ValidationError

from mas import db, locks, names
from mas.agents.letta.client import client, translated
from mas.agents.letta.errors import LettaNotFound
from mas.agents.letta.provisioning import crew
from mas.agents.letta.server import block_text
from mas.config import Settings
from mas.domain.identity import Actor
from mas.memory import blocks as studio_blocks
from mas.memory.blocks import SCHEMAS, BlockError, Change, apply_change
from mas.singletons import per_process

log = logging.getLogger(__name__)

BLOCK_LOCK_TIMEOUT_S = 600
"""Longest a write waits for another process's read-modify-write of the same block (retryable)."""


@per_process(key=lambda settings: settings.letta.url)
def _pushed(settings: Settings) -> dict[str, dict[str, Any]]:  # noqa: ARG001
    """Block id on the server -> the studio value this process last wrote to it."""
    return {}


class LettaBlockStore:
    """The six core blocks on the server: each block's value is its JSON object.

    `read` parses and validates against the block's schema; `update` is a read-modify-write under an
    advisory lock per label (Letta has no compare-and-set), validates the whole new value, refuses it
    over MAS_CORE_BLOCK_MAX_CHARS (never truncates), and writes it back; `push` writes the studio's value
    over the server's. A block a model edited into invalid JSON is reported as a BlockError naming the
    block, not silently reset. A block deleted on the server is provisioned again on its next use.
    """

    def __init__(self, settings: Settings, actor: Actor, *, lock: bool = True) -> None:
        self.settings, self.actor, self.lock = settings, actor, lock

    def read(self, label: str) -> dict[str, Any]:
        return self._on_block(label, lambda block_id: self._retrieve(label, block_id))

    def read_all(self) -> dict[str, dict[str, Any]]:
        return {label: self.read(label) for label in SCHEMAS}

    def update(self, label: str, change: Change) -> dict[str, Any]:
        """Set fields (a dict, or a function of the current value returning the fields); the new value."""
        with self._exclusive(label):
            return self._on_block(label, lambda block_id: self._update(label, block_id, change))

    def push(self, label: str, value: dict[str, Any]) -> bool:
        """Write the studio's `value` over the server's copy, unless this process already wrote exactly
        that to this block; whether it wrote."""
        pushed = _pushed(self.settings)

        def write(block_id: str) -> bool:
            if pushed.get(block_id) == value:
                return False
            with translated(f"writing block {label}"):
                client(self.settings).blocks.update(block_id, value=block_text(value))
            pushed[block_id] = value
            return True

        if label in SCHEMAS and pushed.get(crew(self.settings, self.actor).blocks[label]) == value:
            return False  # the common case: no lock, no server call
        with self._exclusive(label):
            return self._on_block(label, write)

    def _exclusive(self, label: str):
        if not self.lock or label not in SCHEMAS:
            return nullcontext()
        row = studio_blocks.row_label(self.actor, label)  # a user's taste block is theirs: so is its lock
        return locks.held(db.ready_engine(self.settings), names.block_lock(row), timeout_s=BLOCK_LOCK_TIMEOUT_S)

    def _on_block(self, label: str, action: Callable[[str], Any]) -> Any:
        """Run `action(block_id)`; a block deleted on the server is looked up (or provisioned) again once."""
        if label not in SCHEMAS:
            raise BlockError(f"unknown memory block {label!r}; blocks are: {', '.join(SCHEMAS)}")
        block_id = crew(self.settings, self.actor).blocks[label]
        try:
            return action(block_id)
        except LettaNotFound:
            log.warning("Letta block %s (%s) vanished; looking it up again", label, block_id)
        return action(crew(self.settings, self.actor, refresh=True).blocks[label])

    def _retrieve(self, label: str, block_id: str) -> dict[str, Any]:
        with translated(f"reading block {label}"):
            return _parse(label, client(self.settings).blocks.retrieve(block_id).value)

    def _update(self, label: str, block_id: str, change: Change) -> dict[str, Any]:
        current = self._retrieve(label, block_id)
        new = apply_change(self.settings, label, current, change)
        if new != current:
            with translated(f"writing block {label}"):
                client(self.settings).blocks.update(block_id, value=block_text(new))
        return new


def push_studio_blocks(settings: Settings, actor: Actor, *, lock: bool = True) -> list[str]:
    """Bring the server's copies of the core blocks up to date with the studio's; the labels written."""
    store = LettaBlockStore(settings, actor, lock=lock)
    written = [label for label, value in studio_blocks.read_all(settings, actor).items() if store.push(label, value)]
    if written:
        log.debug("pushed blocks %s to Letta", ", ".join(written))
    return written


def _parse(label: str, text: str) -> dict[str, Any]:
    """A block's text as its validated value, or BlockError saying what is wrong with it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BlockError(f"Letta block {label} holds no valid JSON ({exc.msg} at {exc.pos}): {text[:120]!r}") from None
    if not isinstance(value, dict):
        raise BlockError(f"Letta block {label} holds JSON that is not an object")
    try:
        return SCHEMAS[label].model_validate(value).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BlockError(f"Letta block {label}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
