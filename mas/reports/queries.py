"""Read-only questions the command line and people ask of the studio: what is queued, running, done.

Each answer comes from where the truth lives: batches, videos and schedules from PostgreSQL, waiting gpu
work and model residency from Redis. Nothing here writes.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.orm import Session, selectinload

from mas import names
from mas.config import Settings
from mas.db import readable, session_scope
from mas.domain.identity import STUDIO
from mas.domain.steps import STEPS
from mas.learning.promotion import expectation_text
from mas.memory import blocks
from mas.models import ABTest, AgentCall, Attempt, Batch, BatchStatus, Schedule, Video, VideoState
from mas.pipeline import leases, pacing, production, rows
from mas.redaction import redact_url
from mas.runtime.app import app_for, queue_keys
from mas.runtime.clients import redis_client

ENDED = (VideoState.accepted, VideoState.failed, VideoState.cancelled)


def batch_overview(settings: Settings, batch_id: int | None = None) -> Batch | None:
    """The batch (the latest when no id) with its videos in order and their attempts, or None."""
    with session_scope(settings) as session:
        stmt = sa.select(Batch).options(selectinload(Batch.videos).selectinload(Video.attempts))
        stmt = stmt.where(Batch.id == batch_id) if batch_id else stmt.order_by(Batch.id.desc()).limit(1)
        return session.scalars(stmt).first()


@dataclass(frozen=True, kw_only=True)
class Outcomes:
    """How many of a batch's videos have ended, and how."""

    accepted: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def done(self) -> int:
        return self.accepted + self.failed + self.cancelled

    @classmethod
    def of(cls, videos: Iterable[Video]) -> Outcomes:
        """The counts of videos already loaded (a batch's page)."""
        ended = Counter(v.state.value for v in videos)
        return cls(accepted=ended["accepted"], failed=ended["failed"], cancelled=ended["cancelled"])

    def text(self, total: int) -> str:
        """How the videos ended, e.g. `2 accepted, 1 failed of 3 videos`."""
        return f"{self.accepted} accepted, {self.failed} failed of {total} videos"


def outcomes(session: Session, batch_ids: Iterable[int]) -> dict[int, Outcomes]:
    """Each batch's ended videos by how they ended (a batch with none is absent), in one query."""
    rows = session.execute(
        sa.select(Video.batch_id, Video.state, sa.func.count())
        .where(Video.batch_id.in_(list(batch_ids)), Video.state.in_(ENDED))
        .group_by(Video.batch_id, Video.state)
    ).all()
    counts: dict[int, dict[str, int]] = {}
    for batch_id, state, count in rows:
        counts.setdefault(batch_id, {})[state.value] = count
    return {batch_id: Outcomes(**c) for batch_id, c in counts.items()}


# --- where waiting work stands -------------------------------------------------------------------------

_FIRST_GPU = next(i for i, step in enumerate(STEPS) if step.on_gpu)
RENDER_STATE = STEPS[_FIRST_GPU].state
"""A video whose render is due or running."""
BEFORE_THE_GPU = frozenset({VideoState.waiting, *(step.state for step in STEPS[:_FIRST_GPU])})
"""A video on its way to its render: waiting for its turn, or being written."""

RECENT_RENDERS = 20
"""How many of the newest renders (of the configured video backend) the estimate takes the median of."""


@dataclass(frozen=True, kw_only=True)
class Place:
    """Where a video waiting for its render stands: the renders ahead of it and when its own may start."""

    renders_ahead: int
    estimated_start: datetime | None  # None: no render of the video backend measured yet

    def text(self) -> str:
        """E.g. `3 renders ahead, starts ~14:05`, or `start unknown` before any render was measured."""
        if self.estimated_start is None:
            return f"{self.renders_ahead} renders ahead, start unknown"
        return f"{self.renders_ahead} renders ahead, starts ~{self._when()}"

    def short(self) -> str:
        """E.g. `3 ahead ~14:05` (a table's cell)."""
        return f"{self.renders_ahead} ahead" + (f" ~{self._when()}" if self.estimated_start else "")

    def _when(self) -> str:
        assert self.estimated_start is not None
        local = self.estimated_start.astimezone()
        return f"{local:%H:%M}" if local - datetime.now(UTC) < timedelta(hours=20) else f"{local:%Y-%m-%d %H:%M}"


def render_seconds(settings: Settings, session: Session) -> float | None:
    """The median of the newest RECENT_RENDERS measured renders of the configured video backend, or None."""
    seconds = [
        value
        for value in session.scalars(
            sa.select(Attempt.render_seconds)
            .where(Attempt.render_seconds.is_not(None), Attempt.backend == settings.video.backend)
            .order_by(Attempt.id.desc())  # the newest attempts (one's render is timed before it finishes)
            .limit(RECENT_RENDERS)
        )
        if value is not None
    ]
    return statistics.median(seconds) if seconds else None


def places(settings: Settings, session: Session, batch_id: int) -> dict[int, Place]:
    """Each of the batch's videos on its way to the GPU (not yet rendering), by id: the renders ahead of it
    and an estimated start (now + renders ahead x the median measured render, one render at a time).

    Ahead of a video: every render due or running, then the videos already let through to be written (high
    priority first, then oldest batch first), then the waiting videos the fair queue lets through before it
    (`mas.pipeline.pacing.waiting_order`: by each user's share). Only a running batch's videos wait in line (a
    paused batch's wait for `mas continue`). An estimate: it counts renders only (gradings share the GPU,
    refinements add renders), it assumes nobody else asks for work meanwhile, and a studio with several gpu
    workers starts them sooner."""
    running = Batch.status == BatchStatus.running
    written = session.execute(
        sa.select(Video.id, Video.batch_id)
        .join(Batch, Batch.id == Video.batch_id)
        .where(Video.state.in_(list(BEFORE_THE_GPU - {VideoState.waiting})), running)
        .order_by(sa.case((Batch.priority == "high", 0), else_=1), Batch.id, Video.position, Video.id)
    ).all()
    line = [video_id for video_id, _ in written] + pacing.waiting_order(session)
    mine = set(session.scalars(sa.select(Video.id).where(Video.batch_id == batch_id)))
    if not mine & set(line):
        return {}
    rendering = session.scalar(
        sa.select(sa.func.count()).select_from(Video).join(Batch).where(Video.state == RENDER_STATE, running)
    )
    each = render_seconds(settings, session)
    now = datetime.now(UTC)
    found = {}
    for before, video_id in enumerate(line):
        if video_id in mine:
            ahead = (rendering or 0) + before
            start = None if each is None else now + timedelta(seconds=ahead * each)
            found[video_id] = Place(renders_ahead=ahead, estimated_start=start)
    return found


def batch_places(settings: Settings, batch_id: int) -> dict[int, Place]:
    """`places` in a transaction of its own (the CLI's)."""
    with session_scope(settings) as session:
        return places(settings, session, batch_id)


def waiting_on_recovery(settings: Settings) -> dict[int, str]:
    """Videos whose running step's worker stopped beating (killed, cut off): what they wait for, in words.
    Reconcile re-sends such a step once its lease expires (`mas recover`: at once)."""
    return {
        h.video_id: f"{h.step} on {h.worker} stopped answering; waiting on recovery"
        for h in leases.holdings(settings)
        if not h.beating
    }


def recent_videos(settings: Settings, *, batch: int | None = None, limit: int = 50) -> list[Video]:
    """The newest `limit` videos (of one batch, if given), oldest first."""
    stmt = sa.select(Video).order_by(Video.id.desc()).limit(limit)
    if batch is not None:
        stmt = stmt.where(Video.batch_id == batch)
    with session_scope(settings) as session:
        return list(reversed(session.scalars(stmt).all()))


@dataclass(frozen=True, kw_only=True)
class ScheduleRow:
    """A schedule as `mas schedule list` shows it, a bad one included."""

    id: int
    run_at: datetime | None  # None: a time Python cannot hold (`at_text` says what it is)
    at_text: str
    status: str
    batch_id: int | None
    request: str
    failure_reason: str | None  # its user's quotas refused it when it ran
    fault: rows.Fault | None  # it could not be run (`production.run_due_schedules`)

    def runs_at(self) -> str:
        return f"{self.run_at.astimezone():%Y-%m-%d %H:%M}" if self.run_at else f"unreadable: {self.at_text}"


def schedules(settings: Settings, *, limit: int = 100) -> list[ScheduleRow]:
    """Scheduled, sent, cancelled and failed batches, latest start first, each with its fault if it has one."""
    query = (
        sa.select(
            Schedule.id,
            readable(Schedule.run_at),
            sa.cast(Schedule.run_at, sa.Text),
            Schedule.status,
            Schedule.batch_id,
            Schedule.request,
            Schedule.options["failure_reason"].astext,
        )
        .order_by(Schedule.run_at.desc(), Schedule.id.desc())
        .limit(limit)
    )
    with session_scope(settings) as session:
        found = session.execute(query).all()
    faults = rows.faults(settings, production.SCHEDULES_JOB, [row[0] for row in found])
    return [
        ScheduleRow(
            id=id_,
            run_at=run_at,
            at_text=at_text,
            status=status,
            batch_id=batch_id,
            request=request,
            failure_reason=reason if status == "failed" else None,
            fault=faults.get(str(id_)),
        )
        for id_, run_at, at_text, status, batch_id, request, reason in found
    ]


def row_faults(settings: Settings, *, limit: int | None = 20) -> list[tuple[str, str, rows.Fault]]:
    """The newest rows a periodic job could not process, as (job, key, fault): what `mas status` shows (`mas
    faults list`: every one)."""
    query = sa.select(rows.RowFault).order_by(rows.RowFault.failed_at.desc(), rows.RowFault.job).limit(limit)
    with session_scope(settings) as session:
        return [(row.job, row.key, rows.Fault.of(row)) for row in session.scalars(query)]


def pending_work(settings: Settings) -> list[dict[str, Any]]:
    """Work a previous session left unfinished (`session_state.PENDING_WORK`): batch ids and requests."""
    return blocks.read(settings, STUDIO, "session_state")["PENDING_WORK"]  # a shared block


@dataclass(frozen=True, kw_only=True)
class GpuWorker:
    """One gpu worker as it last published itself (after its latest gpu task)."""

    name: str
    device: str
    turns: int  # times work held its GPU
    busy_seconds: float  # how long, in all
    loads: int | None  # model residency (None until it has used a model of its own)
    evictions: int | None
    swaps: int | None
    resident: list[str]


@dataclass(frozen=True, kw_only=True)
class GpuSummary:
    urgent_waiting: int  # high-priority renders and gradings
    renders_waiting: int
    gradings_waiting: int
    workers: list[GpuWorker]


def gpu_summary(settings: Settings) -> GpuSummary:
    """GPU work waiting in the broker by priority, and each gpu worker's turns and model residency."""
    client = redis_client(settings)
    app = app_for(settings)
    urgent, gradings = (
        sum(client.llen(key) for key in queue_keys(app, queue)) for queue in (names.GPU_URGENT_QUEUE, names.GRADE_QUEUE)
    )
    finishing, *new = (client.llen(key) for key in queue_keys(app, names.GPU_QUEUE))
    renders = sum(new)  # a render waits at a refinement's or a new video's level
    if settings.groups_gpu_work:
        renders += finishing
    else:  # gradings share the render queue, at the level of work that finishes what is started
        gradings += finishing
    workers = []
    for key in sorted(client.scan_iter(match=names.GPU_STATS_PREFIX + "*")):
        raw = client.get(key)
        if raw is None:
            continue
        stats = json.loads(raw)
        residency = stats.get("residency") or {}
        workers.append(
            GpuWorker(
                name=stats["worker"],
                device=stats["device"],
                turns=stats["turns"],
                busy_seconds=stats["busy_seconds"],
                loads=residency.get("loads"),
                evictions=residency.get("evictions"),
                swaps=residency.get("swaps"),
                resident=list(residency.get("resident") or []),
            )
        )
    return GpuSummary(urgent_waiting=urgent, renders_waiting=renders, gradings_waiting=gradings, workers=workers)


@dataclass(frozen=True, kw_only=True)
class AgentUsage:
    """What a batch's agent calls cost: calls, seconds and tokens, in all and per video."""

    calls: int
    invalid: int  # calls that never gave a valid reply
    seconds: float
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, served from the endpoint's prompt cache
    completion_tokens: int
    videos: int

    def per_video(self, tokens: int) -> float:
        return tokens / max(self.videos, 1)


PROMPT_ORIGINS = {"model": "the model", "repaired": "repaired", "studio": "the studio"}
"""Who wrote a prompt (`Attempt.prompt_source`), in words: the model's as written, the model's with words the
studio added or removed, or the studio's own."""


def prompt_origin(video: Video) -> str:
    """Who wrote the prompt of the video's latest attempt (its attempts loaded), and whether the studio could
    check it against the user's style; "" before one is written."""
    written = [a for a in video.attempts if a.prompt]
    if not written:
        return ""
    latest = written[-1]
    said = PROMPT_ORIGINS.get(latest.prompt_source, latest.prompt_source)
    return f"{said} (unchecked)" if style_check_word(latest.style_check) == "unchecked" else said


def style_check_word(check: dict | None) -> Literal["applied", "refused", "unchecked"] | None:
    """How a prompt stood against the user's style when written (`Attempt.style_check`); None: not recorded."""
    if check is None:
        return None
    if check.get("checked") is False:
        return "unchecked"
    return "applied" if check.get("applied") else "refused"


def _agent_model(settings: Settings) -> str:
    """The agents' model and endpoint, in words (the endpoint's secrets redacted)."""
    if settings.agents.backend == "llm":
        return f"the model {settings.llm.model!r} at {redact_url(settings.llm.url)}"
    return f"the Letta server at {redact_url(settings.letta.url)}"


def model_unusable(settings: Settings, usage: AgentUsage) -> str | None:
    """What to say when a batch's model answered every call without a valid reply (prose, a cut or malformed
    reply): the studio's own rules made everything instead, and the user should know which model and endpoint."""
    if usage.calls == 0 or usage.invalid < usage.calls or settings.agents.backend == "offline":
        return None
    return (
        f"{_agent_model(settings)} never gave a valid reply ({usage.invalid} of {usage.calls} calls): every plan, "
        "prompt and verdict of this batch is the studio's own; check the model answers the studio's structured "
        "questions"
    )


CALLS_JUDGED = 5
"""The latest agent calls that judge whether the model is usable: none of them valid, and it is not."""


def model_unusable_lately(settings: Settings) -> str | None:
    """Whether the agents' model answers but is unusable now: none of the latest CALLS_JUDGED calls validated
    (`/readyz`, `mas services`); None when it is usable, or there is no model or not enough calls to tell."""
    if settings.agents.backend == "offline":
        return None
    with session_scope(settings) as session:
        valid = session.scalars(sa.select(AgentCall.valid).order_by(AgentCall.id.desc()).limit(CALLS_JUDGED)).all()
    if len(valid) < CALLS_JUDGED or any(valid):
        return None
    return f"answering but unusable: none of the last {CALLS_JUDGED} replies of {_agent_model(settings)} validated"


def agent_usage(settings: Settings, batch_id: int) -> AgentUsage:
    """The agent calls of a batch (its plan and every call about one of its videos), from `agent_calls`."""
    with session_scope(settings) as session:
        video_ids = sa.select(Video.id).where(Video.batch_id == batch_id)
        about = sa.or_(AgentCall.batch_id == batch_id, AgentCall.video_id.in_(video_ids))
        calls, invalid, seconds, prompt, cached, completion = session.execute(
            sa.select(
                sa.func.count(),
                sa.func.count().filter(AgentCall.valid.is_(False)),
                sa.func.coalesce(sa.func.sum(AgentCall.seconds), 0.0),
                sa.func.coalesce(sa.func.sum(AgentCall.prompt_tokens), 0),
                sa.func.coalesce(sa.func.sum(AgentCall.cached_tokens), 0),
                sa.func.coalesce(sa.func.sum(AgentCall.completion_tokens), 0),
            ).where(about)
        ).one()
        videos = session.scalar(sa.select(sa.func.count()).select_from(video_ids.subquery())) or 0
    return AgentUsage(
        calls=calls,
        invalid=invalid,
        seconds=seconds,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        videos=videos,
    )


def expectation(settings: Settings, test_id: int) -> str:
    """What the studio expected the user to pick in A/B test `test_id`, and whether it was right."""
    with session_scope(settings) as session:
        test = session.get(ABTest, test_id)
        if test is None:
            return f"there is no A/B test {test_id}"
        return expectation_text(
            expected=test.expected_label,
            probability=test.expected_probability,
            by=test.expected_by,
            winner=test.winner_label,
        )
