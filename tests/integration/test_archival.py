"""Archival memory against a real PostgreSQL + pgvector and the real all-MiniLM-L6-v2 model."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from mas.db import session_scope
from mas.memory.archival import ArchivalMemory, NewPassage
from mas.memory.embeddings import get_embedder
from mas.runtime import services

PASSAGES = {
    "dragon": "A red dragon breathes fire over a burning castle at dusk.",
    "ocean": "Coral reefs and schools of fish beneath the sea, filmed by a diver.",
    "city": "Neon signs reflect on wet streets of a cyberpunk city at night.",
    "forest": "Elves walk between ancient mossy trees in an enchanted forest.",
    "rocket": "A rocket launches from the pad, leaving a column of smoke into the sky.",
    "mountain": "Snow-covered mountain peaks and a lone climber on a glacier.",
    "kitchen": "A chef slices vegetables in a busy restaurant kitchen.",
    "racing": "Racing cars speed around a track, tires screeching on the final lap.",
    "cat": "A cat sleeps curled up on a sunny windowsill.",
    "desert": "Desert dunes and a camel caravan under a blazing sun.",
    "jazz": "A jazz band plays saxophone and piano in a smoky club.",
    "beach": "Children build a sandcastle on the shore as waves roll in.",
}

# Each query shares no content word with the passage it must find: only meaning can match them.
QUERIES = {
    "winged reptile scorching a fortress with flames": "dragon",
    "marine animals swimming deep in the ocean": "ocean",
    "glowing advertisements in a futuristic metropolis after dark": "city",
    "pointy-eared fantasy folk wandering through old woodland": "forest",
    "spacecraft blasting off toward orbit": "rocket",
    "mountaineer crossing alpine ice near the summit": "mountain",
    "cook chopping carrots during dinner service": "kitchen",
    "motorsport grand prix with fast vehicles": "racing",
    "kitten napping in the sunshine": "cat",
    "arid wasteland crossed by dromedaries": "desert",
    "musicians improvising on stage at a nightclub": "jazz",
}

STOPWORDS = {"a", "an", "the", "of", "in", "on", "at", "by", "with", "and", "into", "from", "up", "under",
             "near", "during", "through", "toward", "as", "off"}


def _content_words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower())) - STOPWORDS


@pytest.fixture
def memory(clean) -> ArchivalMemory:
    return ArchivalMemory(clean)


@pytest.fixture
def stored(memory) -> dict[str, int]:
    """The labelled passages, stored; label -> id."""
    ids = memory.insert_many(NewPassage(text=text) for text in PASSAGES.values())
    return dict(zip(PASSAGES, ids))


def _backdate(engine, passage_id: int, when: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("update archival_passages set created_at=:w where id=:i"), {"w": when, "i": passage_id})


def test_queries_share_no_keyword_with_their_answer():
    for query, label in QUERIES.items():
        assert not _content_words(query) & _content_words(PASSAGES[label]), query


@pytest.mark.parametrize("query", QUERIES)
def test_search_finds_passage_by_meaning(memory, stored, query):
    results = memory.search(query, limit=3)
    assert results[0].id == stored[QUERIES[query]], [r.text for r in results]
    assert results[0].text == PASSAGES[QUERIES[query]]
    similarities = [r.similarity for r in results]
    assert similarities == sorted(similarities, reverse=True)
    assert 0 < similarities[0] <= 1.0 + 1e-6


def test_insert_returns_id_and_keeps_tags_and_metadata(memory):
    passage_id = memory.insert(
        "Slow dolly shots scored higher than handheld ones.",
        tags=["quality", "learning", "quality"],
        metadata={"video_id": 7, "grade": "A"},
    )
    (hit,) = memory.search("camera movement that rated well", limit=1)
    assert hit.id == passage_id
    assert hit.tags == ["quality", "learning"]
    assert hit.metadata == {"video_id": 7, "grade": "A"}
    assert hit.created_at.tzinfo is not None


def test_tag_filter_requires_every_tag(memory):
    both = memory.insert("Fog machines made the haunted house look cheap.", tags=["failure", "quality"])
    memory.insert("Fog machines made the haunted house look cheap and fake.", tags=["failure"])
    memory.insert("Fog made the haunted house look eerie.", tags=["quality"])
    other = memory.insert("Overexposed beach scenes were rejected.", tags=["quality", "failure", "series"])

    results = memory.search("cheap looking fog in a haunted house", tags=["failure", "quality"], limit=10)
    assert [r.id for r in results] == [both, other]
    assert all({"failure", "quality"} <= set(r.tags) for r in results)
    assert memory.search("haunted house", tags=["preference"]) == []


@pytest.fixture
def index_only_memory(memory, settings) -> ArchivalMemory:
    """Archival memory on a connection whose planner avoids sequential and bitmap scans.

    On a table of a few dozen rows PostgreSQL rightly prefers a sequential scan; a large table makes it
    take the HNSW index, which this reproduces without storing a hundred thousand rows.
    """
    url = services.database_url(settings)
    options = quote("-c enable_seqscan=off -c enable_bitmapscan=off")
    forced = settings.model_copy(update={"database_url": f"{url}{'&' if '?' in url else '?'}options={options}"})
    return ArchivalMemory(forced, embedder=memory.embedder)


def test_tag_filter_fills_limit_when_few_passages_match(index_only_memory):
    """Passages outside the filter must not crowd the few inside it out of the HNSW candidates."""
    memory = index_only_memory
    memory.insert_many(NewPassage(text=f"Dragon scene number {i} went well.", tags=["success"]) for i in range(120))
    wanted = memory.insert_many(
        NewPassage(text=text, tags=["preference"])
        for text in ("The user dislikes rainy city scenes.", "The user likes jazz soundtracks.")
    )
    assert len(memory.search("dragon scene", limit=5)) == 5
    results = memory.search("dragon scene", tags=["preference"], limit=5)
    assert sorted(r.id for r in results) == sorted(wanted)


PSYCOPG_PREPARE_THRESHOLD = 5  # psycopg prepares a statement on its sixth run on a connection


def test_searches_are_never_served_by_a_stale_generic_plan(memory, stored):
    """psycopg prepares a statement run five times; PostgreSQL would then reuse one generic plan, made
    under an exact run's settings, for every later search on that connection."""
    query = "kitten napping in the sunshine"
    vector = memory.embedder.embed_one(query)
    for _ in range(PSYCOPG_PREPARE_THRESHOLD):  # from here on psycopg runs the searches as prepared statements
        memory.search(query, limit=3)
        memory.search_by_vector(vector, limit=3, exact=True)
    for _ in range(6):
        assert memory.search(query, limit=3)[0].id == stored["cat"]
        vector = memory.embedder.embed_one(query)
        assert memory.search_by_vector(vector, limit=3, exact=True)[0].id == stored["cat"]
    with session_scope(memory.settings) as session:
        plans = session.execute(
            sa.text("select generic_plans, custom_plans from pg_prepared_statements where statement like :s"),
            {"s": "%embedding <=>%"},
        ).all()
    assert plans, "the searches ran on another connection than this check"
    assert sum(generic for generic, _ in plans) == 0
    assert sum(custom for _, custom in plans) >= 12


def test_time_window(memory, stored, engine):
    _backdate(engine, stored["dragon"], datetime(2024, 1, 10, tzinfo=UTC))
    _backdate(engine, stored["ocean"], datetime(2024, 6, 10, tzinfo=UTC))
    query = "winged reptile scorching a fortress with flames"

    recent = memory.search(query, since=datetime(2025, 1, 1, tzinfo=UTC), limit=20)
    assert stored["dragon"] not in {r.id for r in recent}
    assert len(recent) == len(PASSAGES) - 2

    old = memory.search(query, until=datetime(2025, 1, 1, tzinfo=UTC), limit=20)
    assert [r.id for r in old] == [stored["dragon"], stored["ocean"]]

    window = memory.search(
        query, since=datetime(2024, 3, 1, tzinfo=UTC), until=datetime(2024, 12, 1, tzinfo=UTC)
    )
    assert [r.id for r in window] == [stored["ocean"]]


def test_delete(memory, stored):
    assert memory.delete(stored["cat"]) is True
    assert memory.delete(stored["cat"]) is False
    results = memory.search("kitten napping in the sunshine", limit=20)
    assert stored["cat"] not in {r.id for r in results}
    assert memory.stats().total == len(PASSAGES) - 1


def test_stats(memory, engine):
    empty = memory.stats()
    assert (empty.total, empty.per_tag, empty.oldest, empty.newest) == (0, {}, None, None)

    first = memory.insert("Viewers liked the cat series.", tags=["success", "series"])
    memory.insert("Shaky footage failed twice.", tags=["failure", "quality"])
    memory.insert("A/B test: warm light won.", tags=["ab_test", "success"])
    _backdate(engine, first, datetime(2024, 5, 1, tzinfo=UTC))

    stats = memory.stats()
    assert stats.total == 3
    assert stats.per_tag == {"success": 2, "ab_test": 1, "failure": 1, "quality": 1, "series": 1}
    assert next(iter(stats.per_tag)) == "success"
    assert stats.oldest == datetime(2024, 5, 1, tzinfo=UTC)
    assert stats.newest > datetime.now(UTC) - timedelta(minutes=5)


def test_each_text_is_embedded_once(memory, settings):
    embedder = get_embedder(settings)
    assert memory.embedder is embedder  # one model per process
    text = f"A lighthouse beam sweeps a stormy bay ({uuid.uuid4().hex})."
    calls, embedded = embedder.model_calls, embedder.texts_embedded

    first, again = embedder.embed([text, text])
    assert first == again
    assert (embedder.model_calls, embedder.texts_embedded) == (calls + 1, embedded + 1)

    passage_id = memory.insert(text, tags=["learning"])
    (hit,) = memory.search(text, limit=1)
    assert hit.id == passage_id and hit.similarity == pytest.approx(1.0, abs=1e-5)
    assert (embedder.model_calls, embedder.texts_embedded) == (calls + 1, embedded + 1)


def test_embeddings_are_unit_length(settings):
    (vector,) = get_embedder(settings).embed([f"unit length check {uuid.uuid4().hex}"])
    assert len(vector) == 384
    assert sum(x * x for x in vector) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("bad", [["Success"], ["ab test"], [""], ["ab-test"], ["x" * 65], "success", [3]])
def test_bad_tags_are_refused_and_nothing_is_written(memory, bad):
    with pytest.raises(ValueError, match="tag"):
        memory.insert_many([NewPassage(text="A fine lesson.", tags=["success"]), NewPassage(text="Oops.", tags=bad)])
    with pytest.raises(ValueError, match="tag"):
        memory.search("anything", tags=bad)
    assert memory.stats().total == 0


def test_unknown_lowercase_tags_are_allowed(memory):
    memory.insert("Night scenes need more fill light.", tags=["lighting", "learning"])
    assert memory.stats().per_tag == {"learning": 1, "lighting": 1}


def test_empty_text_is_refused(memory):
    with pytest.raises(ValueError, match="non-empty"):
        memory.insert("   ", tags=["learning"])
    assert memory.stats().total == 0
