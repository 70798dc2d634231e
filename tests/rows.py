"""Rows a test writes straight to the database, as the studio would have stored them."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from mas.models import Batch, Video


def one_video(session: Session, *, request: str = "r", concept: str = "c", **video: Any) -> Video:
    """A batch of one video (its other columns `video`), added to `session` and flushed: its ids are set."""
    batch = Batch(request=request, total=1)
    session.add(batch)
    session.flush()
    row = Video(batch_id=batch.id, position=0, concept=concept, **video)
    session.add(row)
    session.flush()
    return row
