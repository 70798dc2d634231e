"""Production requests as data: JSON round trips and the parser's limits. Pure code: no server."""

import pytest

from mas.config import Settings
from mas.domain.requests import MAX_VARIATIONS, ProductionRequest, RequestError, parse_request


def test_a_request_survives_json_and_bad_json_is_refused():
    settings = Settings()
    for request in (
        parse_request("Create 3 videos of dragons", settings),
        ProductionRequest.series("The Deep", episodes=2, settings=settings),
        ProductionRequest.ab("a kite", variations=3, settings=settings),
    ):
        assert ProductionRequest.from_json(request.to_json()) == request
    good = {"kind": "batch", "count": 2, "theme": "owls", "series_name": None, "text": "Create 2 videos of owls"}
    for bad, says in (
        ([good], "JSON object"),
        ({k: v for k, v in good.items() if k != "theme"}, "no theme"),
        ({**good, "priority": "high"}, "unknown fields: priority"),
        ({**good, "count": "2"}, "count"),
        ({**good, "count": True}, "count"),
        ({**good, "kind": "film"}, "unknown kind"),
        ({**good, "count": 0}, "at least 1"),
        ({**good, "series_name": "Owls"}, "series name"),
        ({**good, "kind": "series"}, "series name"),
        ({**good, "kind": "ab", "count": MAX_VARIATIONS + 1}, "at most"),
        ({**good, "theme": ""}, "of what"),
        ({**good, "text": "owls\x00"}, "NUL"),
    ):
        with pytest.raises(RequestError, match=says):
            ProductionRequest.from_json(bad)


def test_requests_built_from_parts_keep_the_parsers_limits():
    settings = Settings()
    for build, says in (
        (lambda: ProductionRequest.series("  ", episodes=2, settings=settings), "series name is empty"),
        (lambda: ProductionRequest.series("Foxes", episodes=0, settings=settings), "at least 1"),
        (
            lambda: ProductionRequest.series("Foxes", episodes=settings.service.max_batch_videos + 1, settings=settings),
            "MAS_MAX_BATCH_VIDEOS",
        ),
        (lambda: ProductionRequest.series("F" * 201, episodes=1, settings=settings), "series name is 201"),
        (lambda: ProductionRequest.ab("a fox", variations=1, settings=settings), "at least 2"),
        (lambda: ProductionRequest.ab("a fox", variations=MAX_VARIATIONS + 1, settings=settings), "at most"),
        (
            lambda: ProductionRequest.ab("x" * (settings.service.max_request_chars + 1), variations=2, settings=settings),
            "characters long",
        ),
        (lambda: ProductionRequest.ab("a \ud800 fox", variations=2, settings=settings), "the concept"),
    ):
        with pytest.raises(RequestError, match=says):
            build()
