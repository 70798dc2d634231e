"""The production pipeline on the cpu queue, and the chains that join it to the gpu queue.

plan_batch -> per video: write_prompt -> gpu.tasks.generate_video -> gpu.tasks.evaluate_video -> review
-> (refine: a new chain for the next attempt) | record.

Every step is guarded by the video's state and attempt number (`mas.states`): a message delivered twice
either finds the step's work already committed and passes the payload on (the first delivery died before
the next message was sent) or finds the video further along and stops the chain (`Ignore`).
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from celery import chain
from celery.exceptions import Ignore

from mas import ab_design, agents, leases, names, states
from mas.agents.roles import WriterBrief
from mas.celery_app import app, prioritized
from mas.db import session_scope
from mas.errors import PeerUnavailable, RetryableError
from mas.memory import blocks, recall
from mas.memory.archival import ArchivalMemory
from mas.models import (
    ABTest,
    ABVariation,
    Attempt,
    Batch,
    BatchStatus,
    Series,
    Video,
    VideoState,
)
from mas.outcomes import (
    KEEP,
    PENDING_SHOWN,
    fail_on_error,
    fail_planning,
    finish_video,
)
from mas.production import batch_priority
from mas.requests import ProductionRequest

log = logging.getLogger(__name__)
# A transient failure (an agent reply that can't be parsed yet) is retried with backoff; a server that is
# away is waited for (`StudioTask.waits_for_peers`): the batch waits and resumes when it returns.
AGENT_RETRY = dict(
    autoretry_for=(*app.Task.autoretry_for, RetryableError), dont_autoretry_for=(PeerUnavailable,),
    waits_for_peers=True, retry_backoff=2,
    retry_backoff_max=app.settings.agent_retry_backoff_max_seconds, retry_jitter=True,
    max_retries=app.settings.agent_retries,
)
S = VideoState
ARCHIVAL_PATTERNS = 3  # accepted and rejected past attempts nearest the concept, given to the Writer


def _payload(video: Video, attempt: int) -> dict:
    return {"batch_id": video.batch_id, "video_id": video.id, "attempt": attempt}


def video_chain(video_id: int, attempt: int, *, priority: str, start: str = "write"):
    """The chain for one attempt of one video, from `start` (write | generate | evaluate | review); every
    step of high-priority work goes to its urgent queue."""
    payload = None
    steps = []
    if start == "write":
        steps.append(write_prompt.si(video_id, attempt))
    else:
        payload = {"video_id": video_id, "attempt": attempt}
    order = ["generate", "evaluate", "review"]
    task_of = {"generate": names.GENERATE_VIDEO, "evaluate": names.EVALUATE_VIDEO, "review": names.REVIEW}
    for step in order[(order.index(start) if start != "write" else 0):]:
        sig = app.signature(task_of[step])
        steps.append(sig.clone(args=(payload,)) if payload is not None and not steps else sig)
    return chain(*(prioritized(app, step, priority) for step in steps))


# --- plan -----------------------------------------------------------------------------------------


@app.task(
    name=names.PLAN_BATCH, bind=True, on_failure=fail_planning,
    **AGENT_RETRY,
)
def plan_batch(self, batch_id: int) -> dict:
    """Director: turn a stored request into videos, fill the production blocks, start every video."""
    settings = self.app.settings
    with session_scope(settings) as session:
        batch = session.execute(sa.select(Batch).where(Batch.id == batch_id).with_for_update()).scalar_one_or_none()
        if batch is None or batch.status != BatchStatus.queued:
            raise Ignore()
        settings = settings.for_user(batch.user_name)  # the taste blocks of the user it is made for
        crew = agents.backend(settings)
        request = ProductionRequest(
            text=batch.request, kind=batch.kind, count=batch.total, theme=batch.theme,
            series_name=(batch.options or {}).get("series_name"),
        )
        series = None
        if batch.kind == "series":
            name = request.series_name or request.theme
            series = session.execute(sa.select(Series).where(Series.name == name).with_for_update()).scalar_one_or_none()
            if series is None:
                series = Series(name=name, theme=request.theme, episodes_planned=0, episodes_completed=0)
                session.add(series)
                session.flush()
        if batch.kind == "ab":  # the Director proposes, the studio shows what teaches the user's taste most
            proposals = crew.director.plan(ab_design.proposals_request(request, settings=settings))
            plan = ab_design.offer(proposals, count=request.count, settings=settings)
        else:
            plan = crew.director.plan(request, episodes_done=series.episodes_planned if series else 0)
        if series is not None:
            series.style = series.style or plan.series_style
            series.consistency_rules = series.consistency_rules or plan.consistency_rules
            series.elements = series.elements or plan.series_elements
            series.episodes_planned += len(plan.videos)
            batch.series_id = series.id
            blocks.update(settings, "current_series", {
                "ACTIVE_SERIES": series.name, "SERIES_THEME": series.theme, "SERIES_STYLE": series.style,
                "EPISODES_PLANNED": series.episodes_planned, "EPISODES_COMPLETED": series.episodes_completed,
                "SERIES_ELEMENTS": series.elements, "CONSISTENCY_RULES": series.consistency_rules,
            }, actor="director", session=session)
        test = None
        if batch.kind == "ab":
            test = ABTest(concept=request.theme, user_name=batch.user_name)
            session.add(test)
            session.flush()
            batch.ab_test_id = test.id
        videos = []
        for position, planned in enumerate(plan.videos, start=1):
            video = Video(batch_id=batch.id, position=position, concept=planned.concept, label=planned.label)
            session.add(video)
            videos.append((video, planned))
        session.flush()
        if test is not None:
            for video, planned in videos:
                session.add(ABVariation(test_id=test.id, label=planned.label, approach=planned.approach, video_id=video.id))
            variations = [{"label": p.label, "video_id": v.id, "approach": p.approach} for v, p in videos]
            blocks.update(settings, "ab_testing", {
                "ACTIVE_TEST": str(test.id), "VARIATIONS": variations,
                "VARIATION_A_ID": str(videos[0][0].id), "VARIATION_B_ID": str(videos[1][0].id),
            }, actor="director", session=session)
        batch.status = BatchStatus.running
        priority = batch_priority(batch)
        video_ids = [v.id for v, _ in videos]
        blocks.update(settings, "production_queue", {
            "QUEUE_STATUS": "active", "BATCH_ID": str(batch.id), "BATCH_TOTAL": len(video_ids),
            "BATCH_COMPLETE": 0, "PENDING_VIDEOS": video_ids[:PENDING_SHOWN], "IN_PROGRESS": None,
        }, actor="director", session=session)
        blocks.update(settings, "session_state", lambda v: {
            "LAST_ACTIVITY": blocks.now_iso(),
            "IN_PROGRESS_PROJECT": f"batch {batch.id}: {batch.request}",
            "PENDING_WORK": [w for w in v["PENDING_WORK"] if w.get("batch_id") != batch.id][-KEEP:]
            + [{"batch_id": batch.id, "request": batch.request}],
            "QUEUED_VIDEOS": video_ids[:PENDING_SHOWN],
        }, actor="director", session=session)
    recall.append(settings, "director", role="assistant", content=f"planned batch {batch_id}: {len(video_ids)} videos")
    for video_id in video_ids:
        video_chain(video_id, 1, priority=priority).apply_async()
    return {"batch_id": batch_id, "videos": video_ids}


# --- write ----------------------------------------------------------------------------------------


def _brief(settings, session, video: Video, attempt: int) -> WriterBrief:
    style = blocks.read(settings, "user_style")
    quality = blocks.read(settings, "quality_standards")
    series = blocks.read(settings, "current_series") if video.batch.series_id else {}
    ab = blocks.read(settings, "ab_testing")
    approach = ""
    if video.label:
        approach = session.scalar(
            sa.select(ABVariation.approach).where(ABVariation.video_id == video.id)
        ) or ""
    archive = ArchivalMemory(settings)  # retrieved before the call: the Writer's patterns come from here
    successes = [r.metadata.get("prompt", r.text) for r in archive.search(video.concept, tags=["success"], limit=ARCHIVAL_PATTERNS)]
    failures = [r.text for r in archive.search(video.concept, tags=["failure"], limit=ARCHIVAL_PATTERNS)]
    previous = []
    if attempt > 1:
        previous = session.scalar(
            sa.select(Attempt.failure_reasons).where(Attempt.video_id == video.id, Attempt.number == attempt - 1)
        ) or []
    return WriterBrief(
        concept=video.concept, attempt=attempt, user_style=style, series=series,
        winning_patterns=list(ab["WINNING_PATTERNS"]), failure_patterns=list(quality["FAILURE_PATTERNS_TO_AVOID"]),
        past_successes=successes, past_failures=failures, previous_failures=list(previous), approach=approach,
    )


@app.task(
    name=names.WRITE_PROMPT, bind=True, on_failure=fail_on_error,
    **AGENT_RETRY,
)
def write_prompt(self, video_id: int, attempt: int) -> dict:
    """Writer: a prompt for this attempt from the concept, the learned style and past outcomes."""
    settings = self.app.settings
    with leases.hold_step(settings, video_id=video_id, attempt=attempt, step="write"):
        return _write(settings, video_id, attempt)


def _write(settings, video_id: int, attempt: int) -> dict:
    with session_scope(settings) as session:
        video = session.execute(sa.select(Video).where(Video.id == video_id).with_for_update()).scalar_one_or_none()
        if video is None or not states.steps_may_run(session, video_id):
            raise Ignore()
        settings = settings.for_user(video.batch.user_name)  # the user's style, picks and taste
        crew = agents.backend(settings)
        if video.state == S.writing and video.attempt_count == attempt:
            if session.scalar(sa.select(Attempt.id).where(Attempt.video_id == video_id, Attempt.number == attempt)):
                return _payload(video, attempt)  # written before; the next message was never sent
        elif not (
            (video.state == S.pending and attempt == 1) or (video.state == S.refining and video.attempt_count == attempt - 1)
        ):
            raise Ignore()
        else:
            source = S.pending if attempt == 1 else S.refining
            states.transition(session, video_id, source, S.writing, attempt=attempt - 1, attempt_count=attempt)
            session.refresh(video)
        draft = crew.writer.write(_brief(settings, session, video, attempt))
        session.add(Attempt(
            video_id=video_id, number=attempt, prompt=draft.prompt, negative_prompt=draft.negative_prompt,
            seed=draft.seed, backend=settings.video_backend,
        ))
        blocks.update(settings, "production_queue", {"IN_PROGRESS": str(video_id)}, actor="writer", session=session)
        payload = _payload(video, attempt)
    recall.append(settings, "writer", role="assistant", content=f"video {video_id} attempt {attempt}: {draft.prompt}")
    return payload


# --- review and record ----------------------------------------------------------------------------


@app.task(
    name=names.REVIEW, bind=True, on_failure=fail_on_error,
    **AGENT_RETRY,
)
def review(self, payload: dict) -> dict:
    """Cameraman: accept the attempt, refine with a revised prompt, or give up after MAX_RETRIES."""
    settings = self.app.settings
    with leases.hold_step(settings, video_id=payload["video_id"], attempt=payload["attempt"], step="review"):
        return _review(settings, payload)


def _review(settings, payload: dict) -> dict:
    video_id, attempt = payload["video_id"], payload["attempt"]
    with session_scope(settings) as session:
        video = states.at_step(session, video_id, S.evaluating, attempt)
        if video is None or not states.steps_may_run(session, video_id):
            raise Ignore()
        settings = settings.for_user(video.batch.user_name)
        crew = agents.backend(settings)
        row = states.attempt_row(session, video_id, attempt)
        quality = blocks.read(settings, "quality_standards")
        verdict = crew.cameraman.review(
            grade=row.grade, scores=row.scores, min_grade=quality["MIN_ACCEPTABLE_GRADE"], attempt=attempt,
            max_retries=quality["MAX_RETRIES"],
        )
        concept, priority = video.concept, batch_priority(video.batch)
    # archived before the video moves on, so a finished batch has every attempt in archival memory
    _archive_attempt(settings, row, concept=concept, verdict=verdict)
    with session_scope(settings) as session:
        video = session.execute(sa.select(Video).where(Video.id == video_id).with_for_update()).scalar_one()
        if video.state != S.evaluating or video.attempt_count != attempt:
            raise Ignore()
        row = session.get(Attempt, row.id)
        row.failure_reasons = list(dict.fromkeys([*row.failure_reasons, *verdict.failure_reasons]))
        done = {"grade": row.grade, "score": row.scores.get("total"), "output_path": row.output_path}
        if verdict.action == "accept":
            states.transition(session, video_id, S.evaluating, S.accepted, attempt=attempt, **done)
        elif verdict.action == "refine":
            states.transition(session, video_id, S.evaluating, S.refining, attempt=attempt, grade=row.grade)
        else:
            states.transition(
                session, video_id, S.evaluating, S.failed, attempt=attempt,
                failure_reasons=verdict.failure_reasons, **done,
            )
        if verdict.failure_reasons:
            blocks.update(settings, "quality_standards", lambda v: {
                "FAILURE_PATTERNS_TO_AVOID": list(dict.fromkeys(v["FAILURE_PATTERNS_TO_AVOID"] + verdict.failure_reasons))[-KEEP:],
                "REFINEMENT_STRATEGIES": list(dict.fromkeys(v["REFINEMENT_STRATEGIES"] + ([verdict.strategy] if verdict.strategy else [])))[-KEEP:],
            }, actor="cameraman", session=session)
        if verdict.action == "accept" and attempt > 1:
            blocks.update(settings, "quality_standards", lambda v: {
                "SUCCESSFUL_PATTERNS": list(dict.fromkeys(v["SUCCESSFUL_PATTERNS"] + [f"grade {row.grade} after {attempt} attempts: {row.prompt[:120]}"]))[-5:],
            }, actor="cameraman", session=session)
        due = verdict.action != "refine" and finish_video(settings, session, video_id)
    recall.append(
        settings, "cameraman", role="assistant",
        content=f"video {video_id} attempt {attempt}: grade {row.grade} -> {verdict.action} {verdict.failure_reasons}",
    )
    if verdict.action == "refine":
        video_chain(video_id, attempt + 1, priority=priority).apply_async()
    if due:
        consolidate.delay()
    return {**payload, "action": verdict.action, "grade": row.grade}


def _archive_attempt(settings, row: Attempt, *, concept: str, verdict) -> None:
    """One archival passage per graded attempt (keyed by attempt id, so a re-delivery adds none)."""
    with session_scope(settings) as session:
        exists = session.scalar(
            sa.text("select 1 from archival_passages where metadata->>'attempt_id' = :a limit 1"), {"a": str(row.id)}
        )
    if exists:
        return
    accepted = verdict.action == "accept"
    tags = ["success" if accepted else "failure", "quality"] + (["refinement"] if row.number > 1 else [])
    text = f"{'accepted' if accepted else 'rejected'} grade {row.grade}: {concept}. prompt: {row.prompt}"
    if verdict.failure_reasons:
        text += f". failures: {', '.join(verdict.failure_reasons)}"
    meta = {"attempt_id": str(row.id), "video_id": row.video_id, "attempt": row.number, "grade": row.grade,
            "prompt": row.prompt, "scores": row.scores}
    ArchivalMemory(settings).insert(text, tags=tags, metadata=meta)


# --- sleeptime ------------------------------------------------------------------------------------


@app.task(name=names.CONSOLIDATE, bind=True, **AGENT_RETRY)
def consolidate(self) -> dict:
    """Sleeptime: from a clear buffer, summarize recent work into session_state and archival learnings."""
    settings = self.app.settings
    crew = agents.backend(settings)
    recall.begin_run(settings, "director_sleeptime")
    since = blocks.versioned(settings, "session_state").field_updated_at.get("LAST_SESSION_SUMMARY")
    with session_scope(settings) as session:
        stmt = sa.select(Video).where(Video.state.in_(list(states.TERMINAL))).order_by(Video.updated_at)
        if since:
            stmt = stmt.where(Video.updated_at > sa.func.cast(since, sa.DateTime(timezone=True)))
        finished = session.scalars(stmt.limit(200)).all()
        activity = []
        for v in finished:
            prompt = session.scalar(sa.select(Attempt.prompt).where(Attempt.video_id == v.id, Attempt.number == v.attempt_count)) or ""
            activity.append(f"{v.state.value}: video {v.id} grade {v.grade} after {v.attempt_count} attempts; {prompt}")
    for line in activity:
        recall.append(settings, "director_sleeptime", role="user", content=line[:500])
    result = crew.consolidator.consolidate(activity=activity)
    recall.append(settings, "director_sleeptime", role="assistant", content=result.summary)
    blocks.update(settings, "session_state", {
        "LAST_ACTIVITY": blocks.now_iso(), "LAST_SESSION_SUMMARY": result.summary,
    }, actor="director_sleeptime")
    if result.learnings:
        ArchivalMemory(settings).insert_many(
            [_learning(text) for text in result.learnings]
        )
    return {"summary": result.summary, "learnings": result.learnings}


def _learning(text: str):
    from mas.memory.archival import NewPassage

    return NewPassage(text=text, tags=["learning"], metadata={"source": "sleeptime"})


# --- resume ---------------------------------------------------------------------------------------


@app.task(name=names.RESUME_BATCH, bind=True)
def resume_batch(self, batch_id: int) -> dict:
    """Re-send the work of every unfinished video of a batch from the step its state says is next."""
    settings = self.app.settings
    sent = []
    with session_scope(settings) as session:
        batch = session.get(Batch, batch_id)
        if batch is None:
            return {"batch_id": batch_id, "resent": []}
        priority = batch_priority(batch)
        if batch.status == BatchStatus.queued:
            prioritized(app, plan_batch.si(batch_id), priority).apply_async()
            return {"batch_id": batch_id, "resent": ["plan"]}
        for video in session.scalars(sa.select(Video).where(Video.batch_id == batch_id, Video.state.not_in(list(states.TERMINAL)))):
            sent.append((video.id, *next_step(video)))
    for video_id, start, attempt in sent:
        video_chain(video_id, attempt, start=start, priority=priority).apply_async()
    return {"batch_id": batch_id, "resent": [v for v, _, _ in sent]}


def next_step(video: Video) -> tuple[str, int]:
    """Where an unfinished video's work goes on, from its state: (first step, attempt number)."""
    n = video.attempt_count
    return {
        S.pending: ("write", 1), S.writing: ("write", n), S.refining: ("write", n + 1),
        S.generating: ("generate", n), S.evaluating: ("evaluate", n),
    }[video.state]
