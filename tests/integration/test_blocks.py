"""Core memory blocks on real Postgres: defaults, atomic versioned updates, history, caps, schema."""

import json
import multiprocessing as mp

import pytest

from mas.domain.identity import STUDIO
from mas.memory import blocks


def test_every_block_has_every_field(clean):
    every = blocks.read_all(clean, STUDIO)
    assert list(every) == list(blocks.SCHEMAS)
    for label, schema in blocks.SCHEMAS.items():
        assert set(every[label]) == set(schema.model_fields)
    assert every["quality_standards"]["MIN_ACCEPTABLE_GRADE"] == "B"
    assert every["quality_standards"]["MAX_RETRIES"] == 3
    assert every["session_state"]["LAST_ACTIVITY"]  # initialized, never null
    assert every["production_queue"]["PENDING_VIDEOS"] == []


def test_update_is_versioned_with_history(clean):
    before = blocks.versioned(clean, STUDIO, "user_style")  # never written: the defaults, no field changed
    assert before.value == blocks.defaults("user_style", clean) and before.field_updated_at == {}
    blocks.update(clean, STUDIO, "user_style", {"COLOR_PREFERENCES": "purple and blue"}, by="director")
    blocks.set_field(clean, STUDIO, "user_style", "DISLIKED_ELEMENTS", '["bright neon"]', by="cli")
    after = blocks.versioned(clean, STUDIO, "user_style")
    assert after.version == before.version + 2
    assert after.value["COLOR_PREFERENCES"] == "purple and blue"
    assert set(after.field_updated_at) == {"COLOR_PREFERENCES", "DISLIKED_ELEMENTS"}  # only what changed
    changes = blocks.history(clean, STUDIO, "user_style")
    assert [(c.field, c.old, c.new, c.actor) for c in changes] == [
        ("DISLIKED_ELEMENTS", [], ["bright neon"], "cli"),
        ("COLOR_PREFERENCES", "", "purple and blue", "director"),
    ]


@pytest.mark.parametrize(
    "label,change,message",
    [
        ("no_such_block", {"X": 1}, "unknown memory block"),
        ("user_style", {"FAVOURITE_COLOUR": "red"}, "has no field"),
        ("quality_standards", {"MAX_RETRIES": "three"}, "MAX_RETRIES"),
        ("quality_standards", {"MIN_ACCEPTABLE_GRADE": "Z"}, "MIN_ACCEPTABLE_GRADE"),
        ("production_queue", {"QUEUE_STATUS": "exploded"}, "QUEUE_STATUS"),
        ("session_state", {"LAST_ACTIVITY": "yesterday-ish"}, "LAST_ACTIVITY"),
    ],
)
def test_schema_violations_change_nothing(clean, label, change, message):
    snapshot = blocks.read_all(clean, STUDIO)
    with pytest.raises(blocks.BlockError, match=message):
        blocks.update(clean, STUDIO, label, change, by="test")
    assert blocks.read_all(clean, STUDIO) == snapshot


def test_size_cap_refuses_never_truncates(clean):
    before = blocks.versioned(clean, STUDIO, "quality_standards")
    huge = [f"pattern {i}: " + "x" * 80 for i in range(100)]
    with pytest.raises(blocks.BlockError, match="over its cap"):
        blocks.update(clean, STUDIO, "quality_standards", {"FAILURE_PATTERNS_TO_AVOID": huge}, by="test")
    after = blocks.versioned(clean, STUDIO, "quality_standards")
    assert after.version == before.version and after.value == before.value


def _bump(env: dict, n: int) -> None:
    import os

    os.environ.update(env)
    from mas import db
    from mas.config import Settings

    s = Settings()
    db.find(s)  # a new process finds its database as it starts
    for _ in range(n):
        blocks.update(
            s, STUDIO, "production_queue",
            lambda v: {"BATCH_COMPLETE": v["BATCH_COMPLETE"] + 1, "COMPLETED_TODAY": [*v["COMPLETED_TODAY"][-20:], {"video_id": os.getpid(), "batch_id": 1, "grade": "A", "attempts": 1}]},
            by=f"p{os.getpid()}",
        )


def test_concurrent_writers_lose_nothing(clean, studio_env):
    procs, n = 4, 50
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=_bump, args=(studio_env, n)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    block = blocks.versioned(clean, STUDIO, "production_queue")
    assert block.value["BATCH_COMPLETE"] == procs * n
    changes = blocks.history(clean, STUDIO, "production_queue", limit=10_000)
    assert sum(c.field == "BATCH_COMPLETE" for c in changes) == procs * n


def test_a_long_history_of_feedback_stays_within_the_blocks_cap(clean):
    from mas.learning.preferences import learn_style
    from mas.memory import blocks

    colours = ["red", "blue", "green", "purple", "teal", "gold", "crimson", "navy", "amber", "violet"]
    for n in range(30):
        said = f"I love {colours[n % 10]} and slow shots" if n // 10 != 1 else f"no {colours[n % 10]} please"
        learn_style(clean, STUDIO, said)  # each colour liked, then ruled out, then liked again
    stored = blocks.read(clean, STUDIO, "user_style")
    assert ("violet", "liked") in {(i["words"], i["polarity"]) for i in stored["ITEMS"]}
    assert stored["ITEMS"][-1]["feedback"] == "I love violet and slow shots" and stored["ITEM_HISTORY"]
    assert len(json.dumps(stored)) <= clean.memory.core_block_max_chars
