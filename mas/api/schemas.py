"""The JSON API's bodies: what a client sends and gets back, as pydantic models (the OpenAPI document is made
from them). Each model says what it is for; each field has its description."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from mas.models import ABTest, Attempt, Batch, Video
from mas.reports.queries import Outcomes, Place, style_check_word
from mas.text import check_plain

MAX_TEXT_CHARS = 100_000
"""The longest text a body's field may hold (no MAS_MAX_REQUEST_CHARS allows more); the studio's own limits on
each are checked after."""


def _plain(value: str, info: ValidationInfo) -> str:
    return check_plain(value, info.field_name or "a field")


PlainText = Annotated[str, AfterValidator(_plain)]
"""A string field: no NUL or other control character (`mas.text.check_plain`)."""


class Strict(BaseModel):
    """A request body: an unknown field is an error, not silently dropped, and each field takes its own JSON type
    only (true, "3" or 2.0 is no count)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class BatchRequest(Strict):
    """Submit work: a batch from a request in words (`request`) or from its parts, a series' next episodes,
    or an A/B test; now or at a time; for a user; with a webhook for its events."""

    kind: Literal["batch", "series", "ab"] = Field(default="batch", description="What to make.")
    request: PlainText | None = Field(
        default=None,
        max_length=MAX_TEXT_CHARS,
        description='kind batch: the request as a person writes it, e.g. "Create 3 videos of mythical creatures" '
        "(or give count and theme instead).",
        examples=["Create 3 videos of mythical creatures"],
    )
    theme: PlainText | None = Field(
        default=None, max_length=MAX_TEXT_CHARS, description="kind batch: what the videos are of (with count)."
    )
    series_name: PlainText | None = Field(
        default=None, max_length=MAX_TEXT_CHARS, description="kind series: the series, taken whole."
    )
    concept: PlainText | None = Field(
        default=None, max_length=MAX_TEXT_CHARS, description="kind ab: the concept whose variations are compared."
    )
    count: int | None = Field(
        default=None, ge=1, description="Videos (batch), episodes (series, default 1) or variations (ab, default 3)."
    )
    priority: Literal["high", "normal"] | None = Field(
        default=None, description="high goes to the urgent queues; default: high for an A/B test, else normal."
    )
    user: PlainText | None = Field(
        default=None,
        max_length=40,
        description="Whose taste the videos are made for: the caller's by default; only an admin names another user.",
    )
    at: AwareDatetime | None = Field(
        default=None,
        strict=False,  # JSON has no time: read from its text (a number is refused below)
        description="Start the batch at this time (with a time zone) instead of now: a schedule. At most "
        "MAS_SCHEDULE_MAX_DAYS_AHEAD days ahead; a time up to a day past starts it at once.",
    )
    notify_url: PlainText | None = Field(
        default=None,
        max_length=2000,
        description="A webhook receiver for this request's events (needs MAS_WEBHOOK_SECRET).",
    )

    @field_validator("at", mode="before")
    @classmethod
    def _time_as_text(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, str):
            raise ValueError("a time is text such as 2026-12-01T02:00:00+00:00")
        return value


class Submitted(BaseModel):
    """What a submit made: a batch (sent at once) or a schedule (a batch at its time)."""

    batch_id: int | None = Field(description="The batch, when it was started now.")
    schedule_id: int | None = Field(description="The schedule, when it starts later.")
    replayed: bool = Field(description="True when an earlier submit with the same Idempotency-Key made it.")


class AttemptOut(BaseModel):
    number: int
    prompt: str
    grade: str | None
    scores: dict[str, Any]
    failure_reasons: list[Any]
    render_seconds: float | None
    output: str | None = Field(description="Where the storage keeps this attempt's video.")
    prompt_source: Literal["model", "repaired", "studio"] = Field(
        description="Who wrote the prompt: the model, as written; the model's, repaired by the studio (words added "
        "or removed for the user's style); or the studio's own (the model gave no valid prompt)."
    )
    style_check: Literal["applied", "refused", "unchecked"] | None = Field(
        description="The prompt against the user's style when written: it carries what they like and nothing they "
        "ruled out (applied), it does not (refused), or it could not be read to check (unchecked); null: not "
        "recorded."
    )

    @classmethod
    def of(cls, row: Attempt) -> AttemptOut:
        return cls(
            prompt_source=row.prompt_source,  # type: ignore[arg-type]  # the column holds these three
            style_check=style_check_word(row.style_check),
            number=row.number,
            prompt=row.prompt,
            grade=row.grade,
            scores=row.scores or {},
            failure_reasons=row.failure_reasons or [],
            render_seconds=row.render_seconds,
            output=row.output_path,
        )


class VideoOut(BaseModel):
    id: int
    batch_id: int
    position: int
    concept: str
    label: str | None = Field(description="The A/B variation's label, in an A/B test.")
    state: str = Field(description="waiting, writing, rendering, grading, reviewing, accepted, failed, cancelled.")
    attempts: int
    grade: str | None
    failure_reasons: list[Any]
    file_url: str | None = Field(description="The video, served by this server (relative URL), once it exists.")
    attempt_history: list[AttemptOut] | None = Field(default=None, description="Every attempt (one video's page).")
    renders_ahead: int | None = Field(
        default=None,
        description="A video on its way to the GPU (waiting or writing, in a running batch): the renders due or "
        "running and those of videos before it in the order the studio lets them through today; null otherwise "
        "(and in lists).",
    )
    estimated_start: datetime | None = Field(
        default=None,
        description="When its render may start: now + renders_ahead x the median of the recent measured renders, "
        "one at a time (an estimate); null when no render was measured yet (unknown) or it is not waiting.",
    )

    @classmethod
    def of(cls, row: Video, *, with_attempts: bool = False, place: Place | None = None) -> VideoOut:
        return cls(
            renders_ahead=place.renders_ahead if place is not None else None,
            estimated_start=place.estimated_start if place is not None else None,
            id=row.id,
            batch_id=row.batch_id,
            position=row.position,
            concept=row.concept,
            label=row.label,
            state=row.state.value,
            attempts=row.attempt_count,
            grade=row.grade,
            failure_reasons=row.failure_reasons or [],
            file_url=f"/api/v1/videos/{row.id}/file" if row.output_path else None,
            attempt_history=[AttemptOut.of(a) for a in row.attempts] if with_attempts else None,
        )


class BatchOut(BaseModel):
    id: int
    kind: str
    request: str
    status: str = Field(description="queued, running, paused, done, failed, cancelled.")
    priority: str
    user: str
    total: int
    done: int = Field(description="Videos ended: accepted, failed or cancelled.")
    accepted: int
    failed: int
    failure_reason: str | None
    ab_test_id: int | None
    created_at: datetime
    videos: list[VideoOut] | None = Field(default=None, description="The batch's videos (one batch's page).")

    @classmethod
    def of(
        cls,
        row: Batch,
        videos: list[Video] | None = None,
        *,
        counts: Outcomes | None = None,
        places: dict[int, Place] | None = None,
    ) -> BatchOut:
        """The batch, with its videos (their counts from them, and where each waiting one stands: `places`) or
        with `counts` (a list's one query)."""
        places = places or {}
        counts = Outcomes.of(videos) if videos is not None else counts or Outcomes()
        return cls(
            id=row.id,
            kind=row.kind,
            request=row.request,
            status=row.status.value,
            priority=row.priority,
            user=row.user_name,
            total=row.total,
            done=counts.done,
            accepted=counts.accepted,
            failed=counts.failed,
            failure_reason=row.failure_reason,
            ab_test_id=row.ab_test_id,
            created_at=row.created_at,
            videos=[VideoOut.of(v, place=places.get(v.id)) for v in videos] if videos is not None else None,
        )


class VariationOut(BaseModel):
    label: str
    approach: str
    video: VideoOut | None


class ABTestOut(BaseModel):
    id: int
    concept: str
    status: str = Field(description="open (waiting for a pick) or closed.")
    user: str
    ready: bool = Field(description="Every variation is finished: it can be picked.")
    winner: str | None
    expected: str | None = Field(description="The variation the studio expected the user to pick (once picked).")
    variations: list[VariationOut]

    @classmethod
    def of(cls, row: ABTest, videos: dict[int, Video]) -> ABTestOut:
        variations = [
            VariationOut(
                label=v.label,
                approach=v.approach,
                video=VideoOut.of(videos[v.video_id]) if v.video_id in videos else None,
            )
            for v in row.variations
        ]
        ready = all(v.video is not None and v.video.state in ("accepted", "failed") for v in variations)
        return cls(
            id=row.id,
            concept=row.concept,
            status=row.status,
            user=row.user_name,
            ready=ready,
            winner=row.winner_label,
            expected=row.expected_label,
            variations=variations,
        )


class Pick(Strict):
    """The user's winner of an A/B test."""

    label: PlainText = Field(min_length=1, max_length=8, description="The chosen variation's label, e.g. A.")
    user: PlainText | None = Field(
        default=None,
        max_length=40,
        description="Whose pick it is: always the test's owner; a member may name only themselves.",
    )


class Problem(BaseModel):
    """An error (RFC 9457 problem details, media type application/problem+json)."""

    type: str = Field(description="A URN naming the kind of problem.")
    title: str
    status: int
    detail: str = Field(description="What went wrong, for a person.")
    retryable: bool = Field(description="Whether the same request may succeed later (the studio's error tree).")
    errors: list[dict[str, Any]] | None = Field(default=None, description="Each invalid field, for a bad body.")
    retry_after: int | None = Field(
        default=None, description="Seconds after which the same request may pass (a full quota), as `Retry-After`."
    )
