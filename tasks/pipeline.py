"""The pipeline's cpu steps (write, review) and the tasks around them: plan, consolidate, resume.

plan_batch -> per video and attempt: write -> render -> grade -> review (`mas.domain.steps`), each run by
`mas.pipeline.runner`; review's refine starts the next attempt's chain.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa
from celery import shared_task
from celery.exceptions import Ignore
from sqlalchemy.orm import Session

from mas import agents, names
from mas.agents import style_check
from mas.agents.meaning import StudioMeaning
from mas.agents.roles import Draft, ReviewBrief, Verdict, WriterBrief
from mas.agents.style import Style
from mas.db import session_scope
from mas.domain.identity import Actor
from mas.domain.steps import BY_NAME, FIRST, STARTS, STEP_STATES, StepPayload
from mas.learning import ab_design, promotion, style_book
from mas.memory import blocks, recall
from mas.memory.archival import ArchivalMemory
from mas.models import ABVariation, Attempt, Batch, BatchStatus, Series, Video, VideoState
from mas.pipeline import pacing, starting, states
from mas.pipeline.chains import send_released, video_chain
from mas.pipeline.outcomes import fail_planning
from mas.pipeline.production import batch_priority, request_of
from mas.pipeline.runner import Outcome, StepRun, resume_point, step_task
from mas.runtime.app import AgentTask, prioritized

log = logging.getLogger(__name__)
S = VideoState
ARCHIVAL_PATTERNS = 3  # accepted and rejected past attempts nearest the concept, given to the Writer

# --- plan -----------------------------------------------------------------------------------------


@shared_task(name=names.PLAN_BATCH, bind=True, base=AgentTask, on_failure=fail_planning)
def plan_batch(self, batch_id: int) -> dict:
    """Director: turn a stored request into a plan, asked with no transaction open; the plan is stored, and the
    batch started, by `mas.pipeline.starting` only if the batch is still queued."""
    with session_scope(self.app.settings) as session:
        batch = session.get(Batch, batch_id)
        if batch is None or batch.status != BatchStatus.queued:
            raise Ignore()
        settings, actor = self.app.settings, Actor(batch.user_name)  # the user it is made for: their taste blocks
        request, user = request_of(batch), batch.user_name
        series_name = (request.series_name or request.theme) if request.kind == "series" else None
        done = (
            session.scalar(
                sa.select(Series.episodes_planned).where(Series.name == series_name, Series.user_name == user)
            )
            or 0
        )
    crew = agents.backend(settings, actor)
    if request.kind == "ab":  # the Director proposes, the studio shows what teaches the user's taste most
        proposals = crew.director.plan(ab_design.proposals_request(request, settings=settings), batch_id=batch_id)
        plan = ab_design.offer(proposals, count=request.count, settings=settings, actor=actor)
    else:
        plan = crew.director.plan(request, episodes_done=done, batch_id=batch_id)
    style = style_book.applied(blocks.read(settings, actor, "user_style"))  # what its prompts are written against
    with session_scope(settings) as session:
        batch = session.execute(sa.select(Batch).where(Batch.id == batch_id).with_for_update()).scalar_one()
        if batch.status != BatchStatus.queued:
            raise Ignore()  # planned by another delivery meanwhile, or cancelled
        started = starting.start(settings, session, batch, request, plan, style=style)
    recall.append(
        settings, "director", role="assistant", content=f"planned batch {batch_id}: {len(started.video_ids)} videos"
    )
    started.run(self.app)
    return {"batch_id": batch_id, "videos": started.video_ids}


# --- write ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class VideoFacts:
    """What the Writer's brief needs from the video's own rows."""

    concept: str
    in_series: bool
    approach: str
    previous_failures: list[str]
    previous_prompt: str


@dataclass(frozen=True, kw_only=True)
class Written:
    """The Writer's draft and how it stands against the user's style (checked whatever the backend)."""

    draft: Draft
    style_check: dict


class Write:
    """The Writer: a prompt for this attempt from the concept, the learned style and past outcomes."""

    def prepare(self, run: StepRun, session: Session, video: Video) -> VideoFacts:
        approach = session.scalar(sa.select(ABVariation.approach).where(ABVariation.video_id == video.id)) or ""
        previous = session.scalar(
            sa.select(Attempt).where(Attempt.video_id == video.id, Attempt.number == run.attempt - 1)
        )
        return VideoFacts(
            concept=video.concept,
            in_series=video.batch.series_id is not None,
            approach=approach,
            previous_failures=list(previous.failure_reasons or []) if previous else [],
            previous_prompt=previous.prompt if previous else "",
        )

    def work(self, run: StepRun, facts: VideoFacts) -> Written:
        brief = _brief(run.settings, run.actor, facts, run.attempt, run.video_id)
        draft = agents.backend(run.settings, run.actor, rank=promotion.ranker(run.settings, run.actor)).writer.write(
            brief
        )
        checked = (
            draft.style_check
            or style_check.check(draft.prompt, Style.of(brief.user_style), StudioMeaning(run.settings)).as_json()
        )  # the writer's model checked a prompt the studio cannot read; else the studio checks it
        return Written(draft=draft, style_check=checked)

    def record(self, run: StepRun, session: Session, video: Video, written: Written) -> Outcome:
        draft = written.draft
        session.add(
            Attempt(
                video_id=video.id,
                number=run.attempt,
                prompt=draft.prompt,
                negative_prompt=draft.negative_prompt,
                seed=draft.seed,
                backend=run.settings.video.backend,
                prompt_source=draft.source,
                studio_notes=[f"prompt: {draft.note}"] if draft.note else [],
                style_check=written.style_check,
            )
        )
        blocks.update(
            run.settings, run.actor, "production_queue", {"IN_PROGRESS": str(video.id)}, by="writer", session=session
        )

        def remember() -> None:
            recall.append(
                run.settings,
                "writer",
                role="assistant",
                content=f"video {video.id} attempt {run.attempt}: {draft.prompt}",
            )

        return Outcome(state=run.step.next_state, remember=remember)


def _brief(settings, actor: Actor, facts: VideoFacts, attempt: int, video_id: int) -> WriterBrief:
    user_style = blocks.read(settings, actor, "user_style")
    quality = blocks.read(settings, actor, "quality_standards")
    series = blocks.read(settings, actor, "current_series") if facts.in_series else {}
    ab = blocks.read(settings, actor, "ab_testing")
    archive = ArchivalMemory(settings)  # the Writer's patterns come from here
    successes = [
        r.metadata.get("prompt", r.text)
        for r in archive.search(facts.concept, tags=["success"], limit=ARCHIVAL_PATTERNS)
    ]
    failures = [r.text for r in archive.search(facts.concept, tags=["failure"], limit=ARCHIVAL_PATTERNS)]
    return WriterBrief(
        concept=facts.concept,
        attempt=attempt,
        user_style=user_style,
        series=series,
        winning_patterns=list(ab["WINNING_PATTERNS"]),
        failure_patterns=list(quality["FAILURE_PATTERNS_TO_AVOID"]),
        past_successes=successes,
        past_failures=failures,
        previous_failures=facts.previous_failures,
        previous_prompt=facts.previous_prompt,
        approach=facts.approach,
        video_id=video_id,
    )


write_prompt = step_task(BY_NAME["write"], Write())


# --- review ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Graded:
    """The attempt as graded, for the Cameraman and the archive."""

    attempt_id: int
    number: int
    video_id: int
    concept: str
    prompt: str
    grade: str
    scores: dict
    output_path: str | None


class Review:
    """The Cameraman: accept the attempt, refine it with a new attempt, or give the video up."""

    def prepare(self, run: StepRun, session: Session, video: Video) -> Graded:
        row = states.attempt_row(session, video.id, run.attempt)
        return Graded(
            attempt_id=row.id,
            number=row.number,
            video_id=video.id,
            concept=video.concept,
            prompt=row.prompt,
            grade=row.grade or "F",
            scores=dict(row.scores),
            output_path=row.output_path,
        )

    def work(self, run: StepRun, graded: Graded) -> Verdict:
        quality = blocks.read(run.settings, run.actor, "quality_standards")
        verdict = agents.backend(run.settings, run.actor).cameraman.review(
            ReviewBrief(
                grade=graded.grade,
                scores=graded.scores,
                min_grade=quality["MIN_ACCEPTABLE_GRADE"],
                attempt=run.attempt,
                max_retries=quality["MAX_RETRIES"],
                video_id=run.video_id,
            )
        )
        # archived before the video moves on, so a finished batch has every attempt in archival memory
        _archive_attempt(run.settings, graded, verdict=verdict)
        return verdict

    def record(self, run: StepRun, session: Session, video: Video, verdict: Verdict) -> Outcome:
        settings, attempt = run.settings, run.attempt
        row = states.attempt_row(session, video.id, attempt)
        row.failure_reasons = list(dict.fromkeys([*row.failure_reasons, *verdict.failure_reasons]))
        row.review_source = verdict.source
        if verdict.note:
            row.studio_notes = [*row.studio_notes, f"review: {verdict.note}"]
        done = {"grade": row.grade, "score": row.scores.get("total"), "output_path": row.output_path}
        if verdict.failure_reasons:
            blocks.update(
                settings,
                run.actor,
                "quality_standards",
                lambda v: {
                    "FAILURE_PATTERNS_TO_AVOID": list(
                        dict.fromkeys(v["FAILURE_PATTERNS_TO_AVOID"] + verdict.failure_reasons)
                    )[-blocks.KEEP :],
                    "REFINEMENT_STRATEGIES": list(
                        dict.fromkeys(v["REFINEMENT_STRATEGIES"] + ([verdict.strategy] if verdict.strategy else []))
                    )[-blocks.KEEP :],
                },
                by="cameraman",
                session=session,
            )
        if verdict.action == "accept" and attempt > 1:
            success = f"grade {row.grade} after {attempt} attempts: {row.prompt[:120]}"
            blocks.update(
                settings,
                run.actor,
                "quality_standards",
                lambda v: {
                    "SUCCESSFUL_PATTERNS": list(dict.fromkeys(v["SUCCESSFUL_PATTERNS"] + [success]))[-5:],
                },
                by="cameraman",
                session=session,
            )

        def remember() -> None:
            recall.append(
                settings,
                "cameraman",
                role="assistant",
                content=(
                    f"video {video.id} attempt {attempt}: grade {row.grade} -> {verdict.action} {verdict.failure_reasons}"
                ),
            )

        if verdict.action == "accept":
            return Outcome(state=S.accepted, values=done, remember=remember)
        if verdict.action == "fail":
            return Outcome(
                state=S.failed, values={**done, "failure_reasons": verdict.failure_reasons}, remember=remember
            )
        following = StepPayload(video_id=video.id, attempt=attempt + 1)
        priority = batch_priority(video.batch)

        def refine() -> None:
            video_chain(run.task.app, following, start=FIRST, priority=priority).apply_async()

        values = {"attempt_count": attempt + 1, "grade": row.grade}
        return Outcome(state=S.writing, values=values, then=refine, remember=remember)


def _archive_attempt(settings, graded: Graded, *, verdict: Verdict) -> None:
    """One archival passage per graded attempt (keyed by attempt id, so a re-delivery adds none)."""
    with session_scope(settings) as session:
        exists = session.scalar(
            sa.text("select 1 from archival_passages where metadata->>'attempt_id' = :a limit 1"),
            {"a": str(graded.attempt_id)},
        )
    if exists:
        return
    accepted = verdict.action == "accept"
    tags = ["success" if accepted else "failure", "quality"] + (["refinement"] if graded.number > 1 else [])
    text = f"{'accepted' if accepted else 'rejected'} grade {graded.grade}: {graded.concept}. prompt: {graded.prompt}"
    if verdict.failure_reasons:
        text += f". failures: {', '.join(verdict.failure_reasons)}"
    meta = {
        "attempt_id": str(graded.attempt_id),
        "video_id": graded.video_id,
        "attempt": graded.number,
        "grade": graded.grade,
        "prompt": graded.prompt,
        "scores": graded.scores,
    }
    ArchivalMemory(settings).insert(text, tags=tags, metadata=meta)


review = step_task(BY_NAME["review"], Review())


# --- resume ---------------------------------------------------------------------------------------


@shared_task(name=names.RESUME_BATCH, bind=True)
def resume_batch(self, batch_id: int) -> dict:
    """Re-send the work of every unfinished video of a batch from the step its state names."""
    with session_scope(self.app.settings) as session:
        batch = session.get(Batch, batch_id)
        if batch is None:
            return {"batch_id": batch_id, "resent": []}
        priority = batch_priority(batch)
        if batch.status == BatchStatus.queued:
            plan = self.app.signature(names.PLAN_BATCH, args=(batch_id,), priority=STARTS)
            prioritized(self.app, plan, priority).apply_async()
            return {"batch_id": batch_id, "resent": ["plan"]}
        unfinished = session.scalars(
            sa.select(Video).where(Video.batch_id == batch_id, Video.state.in_(list(STEP_STATES)))
        ).all()
        points = [resume_point(video) for video in unfinished]
        released = pacing.release(self.app.settings, session)  # waiting videos, as far as the GPUs need
    for step, payload in points:
        video_chain(self.app, payload, start=step, priority=priority).apply_async()
    send_released(self.app, released)
    return {"batch_id": batch_id, "resent": [p.video_id for _, p in points] + [p.video_id for p, _ in released]}
