"""The embedding model as the agents' checks use it: loaded on the first check that needs it, not before."""

from __future__ import annotations

from mas.config import Settings
from mas.memory.embeddings import get_embedder


class StudioMeaning:
    """MiniLM sentence embeddings (`mas.memory.embeddings`) for the style and plan checks of one process."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def embed(self, texts: list[str]) -> list[list[float]]:
        return get_embedder(self._settings).embed(texts)
