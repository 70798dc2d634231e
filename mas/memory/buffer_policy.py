"""The maintenance v3 policy for message buffers: what to do with a buffer of a given size, and why.

One decision for every buffer the studio maintains: its own Postgres buffers (`mas.memory.recall`) and
the in-context messages of the agents on a Letta server (`mas.agents.letta.maintenance`). Those apply
it with their own side effects; this module only decides, so both follow the same rules:

- count >= MAS_BUFFER_CRITICAL (or EMERGENCY): reset;
- count >= MAS_BUFFER_WARN: summarize, unless MAS_MAX_FAILED_SUMMARIES summaries already failed in a
  row, then reset; a summary that fails counts a failure and resets once the count reaches the maximum;
- below WARN: nothing.

The seed system's finding behind it: history that piles up makes an agent drift from its instructions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Literal

from mas.config import Settings

Level = Literal["ok", "warn", "critical", "emergency"]
ActionKind = Literal["ok", "summarize", "reset"]

LOG_LEVELS: dict[ActionKind, int] = {"ok": logging.DEBUG, "summarize": logging.INFO, "reset": logging.WARNING}
"""How loudly each outcome is logged: a reset loses context, so it is a warning."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What to do with one buffer, at which alarm level, and why."""

    level: Level
    action: ActionKind
    reason: str

    def noting(self, detail: str) -> Decision:
        """The same decision with what carrying it out found appended to the reason."""
        return replace(self, reason=f"{self.reason}; {detail}")


@dataclass(frozen=True, kw_only=True)
class Action:
    """What maintenance did to one agent's buffer, and why (one record per agent and pass)."""

    agent: str
    count_before: int
    action: ActionKind
    level: Level
    count_after: int
    reason: str


def level(settings: Settings, messages: int) -> Level:
    """The alarm level of a buffer holding `messages`."""
    if messages >= settings.memory.buffer_emergency:
        return "emergency"
    if messages >= settings.memory.buffer_critical:
        return "critical"
    if messages >= settings.memory.buffer_warn:
        return "warn"
    return "ok"


def decide(settings: Settings, *, messages: int, failures: int) -> Decision:
    """The decision for a buffer of `messages` whose last `failures` summaries failed in a row."""
    alarm = level(settings, messages)
    limit = settings.memory.max_failed_summaries
    if alarm == "ok":
        return Decision(
            level=alarm, action="ok", reason=f"{messages} messages < warn threshold {settings.memory.buffer_warn}"
        )
    if alarm != "warn":
        threshold = settings.memory.buffer_emergency if alarm == "emergency" else settings.memory.buffer_critical
        return Decision(level=alarm, action="reset", reason=f"{messages} messages >= {alarm} threshold {threshold}")
    if failures >= limit:
        return Decision(level=alarm, action="reset", reason=f"{failures} failed summaries >= {limit}")
    return Decision(
        level=alarm, action="summarize", reason=f"{messages} messages >= warn threshold {settings.memory.buffer_warn}"
    )


def after_failed_summary(settings: Settings, decision: Decision, *, failures: int, problem: str) -> Decision:
    """The follow-up when the summary `decision` asked for failed; `failures` counts this failure too.

    Below the maximum the buffer stays as it is (action "summarize", the failure recorded); at the
    maximum it is reset, which also sets the count back to 0.
    """
    limit = settings.memory.max_failed_summaries
    if failures < limit:
        return replace(decision, action="summarize", reason=f"{problem}; {failures} of {limit} failures")
    return replace(decision, action="reset", reason=f"{problem}; {failures} failures reached {limit}")


def record(agent: str, decision: Decision, *, before: int, after: int) -> Action:
    """The record of a decision carried out on `agent`'s buffer."""
    return Action(
        agent=agent,
        count_before=before,
        action=decision.action,
        level=decision.level,
        count_after=after,
        reason=decision.reason,
    )


def log_action(logger: logging.Logger, action: Action) -> None:
    """Log one record on the maintaining module's logger, as loud as its outcome."""
    logger.log(
        LOG_LEVELS[action.action],
        "maintain %s: %s at level %s, %d -> %d messages: %s",
        action.agent,
        action.action,
        action.level,
        action.count_before,
        action.count_after,
        action.reason,
    )
