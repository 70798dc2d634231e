"""Archival memory: what the studio learned, stored as passages and found again by meaning.

Each passage is a text, its all-MiniLM-L6-v2 embedding, tags and free metadata. Search ranks by cosine
distance through the HNSW index, optionally restricted to passages carrying given tags (the GIN index
serves `tags @> ...`) or written in a time window. `stats` tells an agent how much it remembers and from
when, so it also knows what it does not know.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from mas.config import Settings
from mas.db import session_scope
from mas.errors import InvalidInput
from mas.memory.embeddings import Embedder, get_embedder
from mas.models import ArchivalPassage
from mas.text import check_storable, check_unicode

# The tags agents use today; any other lowercase word is accepted too, so new kinds of lesson need no
# code change.
TAG_VOCABULARY = (
    "success",
    "failure",
    "preference",
    "quality",
    "series",
    "ab_test",
    "refinement",
    "learning",
)
_TAG = re.compile(r"[a-z][a-z0-9_]*")
_TAG_MAX = 64  # the column is varchar(64)[]
_EF_SEARCH_MAX = 1000  # pgvector's upper bound for hnsw.ef_search


@dataclass(frozen=True, kw_only=True)
class NewPassage:
    """One passage to store with `insert_many`."""

    text: str
    tags: Sequence[str] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    id: int
    text: str
    tags: list[str]
    metadata: dict[str, Any]
    created_at: datetime
    similarity: float  # cosine similarity, 1 = same meaning


@dataclass(frozen=True, kw_only=True)
class ArchivalStats:
    total: int
    per_tag: dict[str, int]  # most used first
    oldest: datetime | None
    newest: datetime | None


def validate_tags(tags: Iterable[str]) -> list[str]:
    """Tags as stored: checked to be lowercase words, duplicates dropped, order kept.

    Refusing `"Success"` or `"ab test"` early keeps one spelling per tag, so tag filters and per-tag
    counts stay meaningful.
    """
    if isinstance(tags, str):
        raise InvalidInput(f"tags must be a list of words, not the string {tags!r}")
    checked = []
    for tag in tags:
        if not isinstance(tag, str) or not _TAG.fullmatch(tag) or len(tag) > _TAG_MAX:
            raise InvalidInput(
                f"bad tag {tag!r}: a tag is one lowercase word (a-z, digits, _; at most {_TAG_MAX} "
                f"characters), e.g. {', '.join(TAG_VOCABULARY)}"
            )
        checked.append(tag)
    return list(dict.fromkeys(checked))


def _validate_text(text: str, what: str = "an archival passage") -> str:
    """`text` when it can be embedded: non-empty, with no lone surrogate (the tokenizer fails on one with an
    error that would not say which text)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{what} must be non-empty text")
    check_unicode(text, what)
    return text


def search_statement(
    vector: Sequence[float],
    *,
    tags: Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 10,
) -> sa.Select:
    """The SELECT behind `search`, public so the benchmark can EXPLAIN exactly what search runs.

    Ordering by `embedding <=> vector` with a LIMIT is the shape the HNSW index can serve.
    """
    distance = ArchivalPassage.embedding.cosine_distance(vector)
    passage = ArchivalPassage
    stmt = (  # the embedding column itself is not fetched: 384 floats a row nobody reads
        sa.select(passage.id, passage.text, passage.tags, passage.meta, passage.created_at, distance.label("distance"))
        .order_by(distance)
        .limit(limit)
    )
    if tags:
        # `@>` (contains all), the operator the GIN index serves; the model's generic ARRAY lacks it.
        pg_tags = sa.type_coerce(ArchivalPassage.tags, postgresql.ARRAY(sa.String(64)))
        stmt = stmt.where(pg_tags.contains(validate_tags(tags)))
    if since is not None:
        stmt = stmt.where(ArchivalPassage.created_at >= since)
    if until is not None:
        stmt = stmt.where(ArchivalPassage.created_at < until)
    return stmt


def ef_search_for(limit: int) -> int:
    """HNSW candidate list size for a top-`limit` search.

    pgvector's default 40 gave recall@10 0.976 on 100k clustered vectors, 80 gave 0.997 for about 0.1 ms
    more (bench/RESULTS-archival.md); the list must also comfortably exceed `limit`.
    """
    return min(_EF_SEARCH_MAX, max(80, 2 * limit))


class ArchivalMemory:
    """Insert, search, delete and count archival passages in this settings' database."""

    def __init__(self, settings: Settings, *, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self._embedder = embedder

    @property
    def embedder(self) -> Embedder:
        """Loaded on first need, so counting or deleting passages never loads the model."""
        if self._embedder is None:
            self._embedder = get_embedder(self.settings)
        return self._embedder

    def insert(self, text: str, *, tags: Sequence[str] = (), metadata: dict[str, Any] | None = None) -> int:
        """Store one passage; return its id."""
        return self.insert_many([NewPassage(text=text, tags=tags, metadata=metadata or {})])[0]

    def insert_many(self, items: Iterable[NewPassage]) -> list[int]:
        """Store passages in one transaction with one embedding call; return their ids in order.

        Everything is validated before anything is embedded or written, so one bad tag stores nothing.
        """
        rows: list[dict[str, Any]] = [
            {"text": _validate_text(item.text), "tags": validate_tags(item.tags), "meta": dict(item.metadata)}
            for item in items
        ]
        check_storable([[row["text"], row["meta"]] for row in rows], "an archival passage")
        if not rows:
            return []
        vectors = self.embedder.embed([row["text"] for row in rows])
        for row, vector in zip(rows, vectors):
            row["embedding"] = vector
        stmt = sa.insert(ArchivalPassage).returning(ArchivalPassage.id, sort_by_parameter_order=True)
        with session_scope(self.settings) as session:
            return list(session.scalars(stmt, rows))

    def search(
        self,
        query: str,
        *,
        tags: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 10,
    ) -> list[SearchResult]:
        """Passages nearest in meaning to `query`, best first.

        `tags`: only passages carrying all of them; `since` (inclusive) / `until` (exclusive): only
        passages created in that window.
        """
        query = _validate_text(query, "the search text")  # before the model loads
        vector = self.embedder.embed_one(query)
        return self.search_by_vector(vector, tags=tags, since=since, until=until, limit=limit)

    def search_by_vector(
        self,
        vector: Sequence[float],
        *,
        tags: Sequence[str] | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 10,
        exact: bool = False,
    ) -> list[SearchResult]:
        """`search` for an embedding already at hand; `exact` skips the HNSW index (slow, for checks).

        An HNSW scan yields at most `hnsw.ef_search` candidates and pgvector 0.6 applies filters after
        it, so a selective filter can leave fewer than `limit` results although more passages match.
        Then the search is redone exactly: cheap for tags, whose GIN index finds the few matching
        passages; a narrow time window alone means a sequential scan, as created_at has no index.
        """
        if not 1 <= limit <= _EF_SEARCH_MAX:
            raise InvalidInput(f"limit must be between 1 and {_EF_SEARCH_MAX}, got {limit}")
        stmt = search_statement(vector, tags=tags, since=since, until=until, limit=limit)
        filtered = bool(tags) or since is not None or until is not None
        with session_scope(self.settings) as session:
            plan_search(session, limit=limit, exact=exact)
            rows = session.execute(stmt).all()
            if filtered and not exact and len(rows) < limit:
                plan_search(session, limit=limit, exact=True)
                rows = session.execute(stmt).all()
        return [
            SearchResult(
                id=row.id,
                text=row.text,
                tags=list(row.tags),
                metadata=dict(row.meta),
                created_at=row.created_at,
                similarity=1.0 - float(row.distance),
            )
            for row in rows
        ]

    def delete(self, passage_id: int) -> bool:
        """Forget one passage; False when there was none with that id."""
        stmt = sa.delete(ArchivalPassage).where(ArchivalPassage.id == passage_id).returning(ArchivalPassage.id)
        with session_scope(self.settings) as session:
            return session.execute(stmt).first() is not None

    def stats(self) -> ArchivalStats:
        """How many passages, how many per tag, and the time span they cover."""
        with session_scope(self.settings) as session:
            total, oldest, newest = session.execute(
                sa.select(
                    sa.func.count(), sa.func.min(ArchivalPassage.created_at), sa.func.max(ArchivalPassage.created_at)
                )
            ).one()
            tag = sa.func.unnest(ArchivalPassage.tags).table_valued("tag").render_derived()
            per_tag = session.execute(
                sa.select(tag.c.tag, sa.func.count())
                .select_from(ArchivalPassage)
                .join(tag, sa.true())
                .group_by(tag.c.tag)
                .order_by(sa.func.count().desc(), tag.c.tag)
            ).all()
        return ArchivalStats(total=total, per_tag=dict(per_tag), oldest=oldest, newest=newest)


def plan_search(
    conn: Session | sa.Connection, *, limit: int, exact: bool = False, ef_search: int | None = None
) -> None:
    """Decide, for the rest of the transaction, how the next search statement is planned.

    Every search is planned afresh (`force_custom_plan`): psycopg prepares a statement after five runs,
    and PostgreSQL then reuses one generic plan, made under whatever settings held at the time (an exact
    run's, say) and blind to the LIMIT and tags that decide whether the HNSW index pays. Measured at 100k
    passages, that turned 5 ms index searches into 40 ms exact scans on that connection from then on.
    Exact: no index scan (the only kind HNSW offers), while sequential and GIN bitmap scans stay allowed
    whatever the server's own planner settings say. `ef_search` overrides `ef_search_for(limit)`.
    """
    values = {"plan_cache_mode": "force_custom_plan"}
    if exact:
        values |= {"enable_indexscan": "off", "enable_seqscan": "on", "enable_bitmapscan": "on"}
    else:
        values["hnsw.ef_search"] = str(ef_search or ef_search_for(limit))
    # SET LOCAL through set_config, which takes bind parameters: all in one round trip.
    conn.execute(sa.select(*(sa.func.set_config(name, value, True) for name, value in values.items())))
