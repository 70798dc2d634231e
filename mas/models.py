"""The database: PostgreSQL is the source of truth for every batch, video, attempt and memory.

Broker messages only trigger work; anything lost from Redis can be rebuilt from these rows.
"""

from __future__ import annotations

from datetime import datetime

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from mas.domain.identity import DEFAULT_USER
from mas.domain.states import BatchStatus, VideoState
from mas.names import Priority

EMBEDDING_DIM = 384  # all-MiniLM-L6-v2


def users_own(name: str, user: str) -> str:
    """What the studio calls `user`'s own `name` (a block row, an agent, their locks): `name` itself for the
    default user, who had them before users existed, `name@user` for a named one."""
    return name if user == DEFAULT_USER else f"{name}@{user}"


def _user_column() -> Mapped[str]:
    """Whose a row is (`mas.domain.identity.Actor`: a command's `--user`, the caller, a batch's user)."""
    return mapped_column(String(40), default=DEFAULT_USER, server_default=DEFAULT_USER, index=True)


def _priority_column() -> Mapped[Priority]:
    """The priority work runs at (`mas.names.Priority`)."""
    return mapped_column(String(8), default="normal", server_default="normal")


class Base(DeclarativeBase):
    pass


def _now_column() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(primary_key=True)
    request: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16), default="batch")  # batch | series | ab
    theme: Mapped[str] = mapped_column(Text, default="")
    total: Mapped[int] = mapped_column(Integer)
    status: Mapped[BatchStatus] = mapped_column(Enum(BatchStatus, name="batch_status"), default=BatchStatus.queued)
    series_id: Mapped[int | None] = mapped_column(ForeignKey("series.id"))
    ab_test_id: Mapped[int | None] = mapped_column(ForeignKey("ab_tests.id"))
    options: Mapped[dict] = mapped_column(JSONB, default=dict)  # no longer written: the spec and priority say it
    # the typed request (`ProductionRequest.to_json`); None only for a row written directly, not by `new_batch`
    spec: Mapped[dict | None] = mapped_column(JSONB)
    priority: Mapped[Priority] = _priority_column()
    failure_reason: Mapped[str | None] = mapped_column(Text)
    user_name: Mapped[str] = _user_column()
    notify_url: Mapped[str | None] = mapped_column(Text)  # this request's webhook (`--notify`), beside the studio's
    style: Mapped[dict | None] = mapped_column(JSONB)  # the style its plan applies (`style_book.applied`)
    created_at: Mapped[datetime] = _now_column()
    updated_at: Mapped[datetime] = _now_column()

    videos: Mapped[list[Video]] = relationship(back_populates="batch", order_by="Video.position")


class Video(Base):
    __tablename__ = "videos"
    __table_args__ = (UniqueConstraint("batch_id", "position"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    concept: Mapped[str] = mapped_column(Text)
    label: Mapped[str | None] = mapped_column(String(8))  # A/B variation label
    state: Mapped[VideoState] = mapped_column(
        Enum(VideoState, native_enum=False, length=32), default=VideoState.writing, index=True
    )
    attempt_count: Mapped[int] = mapped_column(Integer, default=1)  # the attempt its live state is about
    grade: Mapped[str | None] = mapped_column(String(1))
    score: Mapped[float | None] = mapped_column(Float)
    output_path: Mapped[str | None] = mapped_column(Text)
    failure_reasons: Mapped[list] = mapped_column(JSONB, default=list)
    created_at: Mapped[datetime] = _now_column()
    updated_at: Mapped[datetime] = _now_column()

    batch: Mapped[Batch] = relationship(back_populates="videos")
    attempts: Mapped[list[Attempt]] = relationship(back_populates="video", order_by="Attempt.number")


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("video_id", "number"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    video_id: Mapped[int] = mapped_column(ForeignKey("videos.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[str] = mapped_column(Text, default="")
    negative_prompt: Mapped[str] = mapped_column(Text, default="")
    seed: Mapped[int] = mapped_column(Integer, default=0)
    backend: Mapped[str] = mapped_column(String(32), default="")
    grader: Mapped[str] = mapped_column(String(32), default="")
    output_path: Mapped[str | None] = mapped_column(Text)
    scores: Mapped[dict] = mapped_column(JSONB, default=dict)
    grade: Mapped[str | None] = mapped_column(String(1))
    failure_reasons: Mapped[list] = mapped_column(JSONB, default=list)
    render_seconds: Mapped[float | None] = mapped_column(Float)
    render_id: Mapped[str | None] = mapped_column(String(36))  # the render server's id of this attempt's job
    # who wrote the prompt: model | repaired (the studio added or removed words) | studio (its own prompt)
    prompt_source: Mapped[str] = mapped_column(String(16), default="model", server_default="model")
    review_source: Mapped[str | None] = mapped_column(String(16))  # model | studio (the rule alone decided)
    studio_notes: Mapped[list] = mapped_column(JSONB, default=list, server_default="[]")  # why it stepped in
    # the prompt against the user's style when written: {"applied": bool, "missing": [...], "disliked": [...]}
    style_check: Mapped[dict | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    video: Mapped[Video] = relationship(back_populates="attempts")


class StepLease(Base):
    """Which delivery runs a step of an attempt, and whether it is alive (`mas.pipeline.leases`)."""

    __tablename__ = "step_leases"

    video_id: Mapped[int] = mapped_column(ForeignKey("videos.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[str] = mapped_column(String(16), primary_key=True)
    token: Mapped[str | None] = mapped_column(String(32))  # None: no delivery holds it now
    worker: Mapped[str] = mapped_column(Text, default="")
    claims: Mapped[int] = mapped_column(Integer, default=1)  # deliveries that started the step
    started_at: Mapped[datetime] = _now_column()
    heartbeat_at: Mapped[datetime] = _now_column()


class MemoryBlock(Base):
    """One shared core memory block; `version` guards concurrent writers."""

    __tablename__ = "memory_blocks"

    label: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict] = mapped_column(JSONB)
    field_updated_at: Mapped[dict] = mapped_column(JSONB, default=dict)
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[datetime] = _now_column()


class MemoryBlockChange(Base):
    """History of every field change of a core block: who, when, old, new."""

    __tablename__ = "memory_block_changes"

    id: Mapped[int] = mapped_column(primary_key=True)
    label: Mapped[str] = mapped_column(ForeignKey("memory_blocks.label"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    field: Mapped[str] = mapped_column(String(64))
    old: Mapped[object] = mapped_column(JSONB, nullable=True)
    new: Mapped[object] = mapped_column(JSONB, nullable=True)
    actor: Mapped[str] = mapped_column(String(64))
    changed_at: Mapped[datetime] = _now_column()


class ArchivalPassage(Base):
    """Long-term memory: a text with its embedding, tags and metadata."""

    __tablename__ = "archival_passages"
    __table_args__ = (
        Index(
            "ix_archival_embedding_hnsw",
            "embedding",
            postgresql_using="hnsw",
            postgresql_ops={"embedding": "vector_cosine_ops"},
        ),
        Index("ix_archival_tags", "tags", postgresql_using="gin"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    embedding: Mapped[list[float]] = mapped_column(Vector(EMBEDDING_DIM))
    tags: Mapped[list[str]] = mapped_column(ARRAY(String(64)), default=list)
    meta: Mapped[dict] = mapped_column("metadata", JSONB, default=dict)
    created_at: Mapped[datetime] = _now_column()


class AgentMessage(Base):
    """Recall memory: every message an agent saw; `in_context` marks its live buffer."""

    __tablename__ = "agent_messages"
    __table_args__ = (Index("ix_agent_messages_agent_context", "agent", "in_context"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    agent: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    in_context: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = _now_column()


class AgentCall(Base):
    """One role call to a model: which conversation answered, about which video or batch, how many tries
    and seconds, and its tokens (prompt, of them served from the endpoint's prompt cache, completion)."""

    __tablename__ = "agent_calls"

    id: Mapped[int] = mapped_column(primary_key=True)
    agent: Mapped[str] = mapped_column(String(64))
    task: Mapped[str] = mapped_column(String(32))
    # plain ids, no foreign keys: the record of a cost never stops the call it records, nor a clean-up
    video_id: Mapped[int | None] = mapped_column(Integer, index=True)
    batch_id: Mapped[int | None] = mapped_column(Integer, index=True)
    tries: Mapped[int] = mapped_column(Integer)
    valid: Mapped[bool] = mapped_column(Boolean)
    seconds: Mapped[float] = mapped_column(Float)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now_column()


class AgentBuffer(Base):
    """Per-agent buffer bookkeeping: the running summary and failed summarize attempts."""

    __tablename__ = "agent_buffers"

    agent: Mapped[str] = mapped_column(String(64), primary_key=True)
    summary: Mapped[str] = mapped_column(Text, default="")
    failed_summaries: Mapped[int] = mapped_column(Integer, default=0)
    interactions: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = _now_column()


class Series(Base):
    __tablename__ = "series"

    __table_args__ = (UniqueConstraint("user_name", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))  # one user's series names are theirs alone
    user_name: Mapped[str] = _user_column()
    theme: Mapped[str] = mapped_column(Text, default="")
    style: Mapped[str] = mapped_column(Text, default="")
    consistency_rules: Mapped[list] = mapped_column(JSONB, default=list)
    elements: Mapped[list] = mapped_column(JSONB, default=list)
    episodes_planned: Mapped[int] = mapped_column(Integer, default=0)
    episodes_completed: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = _now_column()


class ABTest(Base):
    __tablename__ = "ab_tests"

    id: Mapped[int] = mapped_column(primary_key=True)
    concept: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="open")  # open | closed
    winner_label: Mapped[str | None] = mapped_column(String(8))
    user_name: Mapped[str] = _user_column()
    # the variation the studio expected the user to pick, written just before the pick is stored
    expected_label: Mapped[str | None] = mapped_column(String(8))
    expected_probability: Mapped[float | None] = mapped_column(Float)
    expected_by: Mapped[str | None] = mapped_column(Text)  # which taste model, or why none
    created_at: Mapped[datetime] = _now_column()

    variations: Mapped[list[ABVariation]] = relationship(order_by="ABVariation.label")


class ABVariation(Base):
    __tablename__ = "ab_variations"
    __table_args__ = (UniqueConstraint("test_id", "label"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    test_id: Mapped[int] = mapped_column(ForeignKey("ab_tests.id", ondelete="CASCADE"))
    label: Mapped[str] = mapped_column(String(8))
    approach: Mapped[str] = mapped_column(Text, default="")
    video_id: Mapped[int | None] = mapped_column(ForeignKey("videos.id"))


class ABSelection(Base):
    """A user's choice: the chosen variation against each rejected one (DPO pairs)."""

    __tablename__ = "ab_selections"

    id: Mapped[int] = mapped_column(primary_key=True)
    test_id: Mapped[int] = mapped_column(ForeignKey("ab_tests.id", ondelete="CASCADE"))
    chosen_label: Mapped[str] = mapped_column(String(8))
    chosen_prompt: Mapped[str] = mapped_column(Text, default="")
    rejected_prompts: Mapped[list] = mapped_column(JSONB, default=list)
    chosen_scores: Mapped[dict] = mapped_column(JSONB, default=dict)  # the chosen video's per-axis scores
    rejected_scores: Mapped[list] = mapped_column(JSONB, default=list)  # per rejected prompt, same order
    concept: Mapped[str] = mapped_column(Text, default="")
    user_name: Mapped[str] = _user_column()
    created_at: Mapped[datetime] = _now_column()


class TrainedAdapter(Base):
    __tablename__ = "trained_adapters"

    id: Mapped[int] = mapped_column(primary_key=True)
    version: Mapped[int] = mapped_column(Integer, unique=True)
    path: Mapped[str] = mapped_column(Text)
    base_model: Mapped[str] = mapped_column(Text)
    pairs_used: Mapped[int] = mapped_column(Integer)
    heldout_accuracy: Mapped[float | None] = mapped_column(Float)
    promoted: Mapped[bool] = mapped_column(Boolean, default=False)
    metrics: Mapped[dict] = mapped_column(JSONB, default=dict)
    user_name: Mapped[str] = _user_column()
    created_at: Mapped[datetime] = _now_column()


class TasteModel(Base):
    """A fitted pairwise taste (`mas.learning.taste`) of one user, promoted or kept on file with the reason."""

    __tablename__ = "taste_models"
    __table_args__ = (UniqueConstraint("user_name", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    user_name: Mapped[str] = mapped_column(String(40), index=True)
    version: Mapped[int] = mapped_column(Integer)
    pairs_used: Mapped[int] = mapped_column(Integer)
    # the pairs the promotion verdict rests on (each predicted without its pick) and the accuracy there
    heldout_pairs: Mapped[int] = mapped_column(Integer)
    heldout_accuracy: Mapped[float | None] = mapped_column(Float)
    promoted: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    # "served": weights, calibration, features (`mas.learning.taste.PairwiseTaste`); "last_pick": newest pick fitted on
    model: Mapped[dict] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now_column()


class Schedule(Base):
    """An overnight batch: a request to enqueue at a given time, stored so no restart loses it."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    request: Mapped[str] = mapped_column(Text)
    # spec, priority and user_name were kept here before their columns; now only a failed run's reason
    options: Mapped[dict] = mapped_column(JSONB, default=dict)
    spec: Mapped[dict | None] = mapped_column(JSONB)  # the typed request; None for one stored before 0005
    priority: Mapped[Priority] = _priority_column()
    user_name: Mapped[str] = _user_column()
    # scheduled|sent|cancelled|failed (its user's quotas refused its batch when it ran)
    status: Mapped[str] = mapped_column(String(16), default="scheduled")
    batch_id: Mapped[int | None] = mapped_column(ForeignKey("batches.id"))
    notify_url: Mapped[str | None] = mapped_column(Text)  # passed on to its batch
    created_at: Mapped[datetime] = _now_column()

    @property
    def failure_reason(self) -> str | None:
        """Why the schedule failed when it ran (`mas.pipeline.production.run_due_schedules`), or None."""
        return (self.options or {}).get("failure_reason") if self.status == "failed" else None


class WebhookEvent(Base):
    """One event for one receiver, written in the transaction of the change it reports (the outbox) and
    delivered at least once (`mas.outbox.webhooks`); `id` is the same on every try, so a receiver drops repeats."""

    __tablename__ = "webhook_events"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # the order of events, per batch and receiver
    id: Mapped[str] = mapped_column(String(40), unique=True)  # "msg_" + 32 hex: the Standard Webhooks id
    type: Mapped[str] = mapped_column(String(40))  # batch.done, video.accepted, ...
    url: Mapped[str] = mapped_column(Text)
    batch_id: Mapped[int | None] = mapped_column(Integer, index=True)  # plain id: an event outlives its batch
    payload: Mapped[dict] = mapped_column(JSONB)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = _now_column()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # tries spent: given up
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now_column()


class StudioEvent(Base):
    """One thing that happened, in the studio's event log (`mas.outbox.eventlog`): one row per event, written
    in the transaction of the change it reports; ids commit in increasing order, so a reader resumes after the
    last id it saw. Followed live through the API's event streams; kept MAS_EVENT_RETENTION_DAYS."""

    __tablename__ = "studio_events"
    __table_args__ = (
        Index("ix_studio_events_user_id", "user_name", "id"),  # a user's stream
        Index("ix_studio_events_batch_id", "batch_id", "id"),  # a batch's stream
        Index("ix_studio_events_created_at", "created_at"),  # retention
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # bigserial: the event's place in the log
    type: Mapped[str] = mapped_column(String(40))  # video.state, video.accepted, batch.done, ...
    batch_id: Mapped[int | None] = mapped_column(Integer)  # plain id: an event outlives its batch
    user_name: Mapped[str] = mapped_column(String(40))  # whose batch: whose stream carries it
    payload: Mapped[dict] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now_column()


class IdempotencyKey(Base):
    """A client's `Idempotency-Key` on a submit, and the batch it made: the same key again returns that
    batch instead of making another."""

    __tablename__ = "idempotency_keys"

    user_name: Mapped[str] = mapped_column(String(40), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))  # a key reused for another request is refused
    batch_id: Mapped[int | None] = mapped_column(Integer)
    schedule_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now_column()


class User(Base):
    """Someone the studio knows by credential (`mas users add`): their role, and their gallery login's
    password hash (scrypt) when they have one."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))  # admin | member (`mas.domain.identity.ROLES`)
    password_hash: Mapped[str | None] = mapped_column(Text)
    # their share of the GPU against other users' (weighted fair queuing in `mas.pipeline.pacing`)
    gpu_share: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    # quotas; None: the studio's default (MAS_QUOTA_*)
    videos_per_day: Mapped[int | None] = mapped_column(Integer)
    videos_waiting: Mapped[int | None] = mapped_column(Integer)
    batches_at_once: Mapped[int | None] = mapped_column(Integer)
    webhook_secret: Mapped[str | None] = mapped_column(Text)  # signs their events instead of MAS_WEBHOOK_SECRET
    created_at: Mapped[datetime] = _now_column()


class ApiKey(Base):
    """One API key of a user: only the SHA-256 of its secret is kept; the key itself is shown once."""

    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(String(16), primary_key=True)  # the key's public part: `mas_<key_id>_...`
    user_name: Mapped[str] = mapped_column(ForeignKey("users.name", ondelete="CASCADE"), index=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _now_column()
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class FairPass(Base):
    """How much of the GPU a user has been given, in units of their share (stride scheduling): the next
    video let through is the waiting user's with the lowest pass."""

    __tablename__ = "fair_passes"

    user_name: Mapped[str] = mapped_column(String(40), primary_key=True)
    pass_value: Mapped[float] = mapped_column(Float, default=0.0)


class StyleItemRow(Base):
    """One item of a user's style (`mas.learning.style_book`): liked or ruled out, where it came from and what
    it was before each change (oldest first). The `user_style` block is written from these."""

    __tablename__ = "style_items"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_name: Mapped[str] = _user_column()
    aspect: Mapped[str] = mapped_column(String(16))
    words: Mapped[str] = mapped_column(Text)
    polarity: Mapped[str] = mapped_column(String(16))  # liked | ruled_out
    source: Mapped[str] = mapped_column(String(16))  # `mas.learning.style_book.SOURCES`
    feedback: Mapped[str] = mapped_column(Text, default="")
    history: Mapped[list] = mapped_column(JSONB, default=list)
    updated_at: Mapped[datetime] = _now_column()


class StyleFeedback(Base):
    """A user's style feedback as it was read: by whom, and the clauses not understood (shown, never enforced)."""

    __tablename__ = "style_feedback"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_name: Mapped[str] = _user_column()
    feedback: Mapped[str] = mapped_column(Text)
    reader: Mapped[str] = mapped_column(String(16))  # studio | model
    not_understood: Mapped[list] = mapped_column(JSONB, default=list)
    created_at: Mapped[datetime] = _now_column()
