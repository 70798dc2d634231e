"""The studio as a service: a versioned JSON API (`/api/v1`) served by `mas serve` beside the gallery.

The gallery's gate authenticates every request (basic auth, or `Authorization: Bearer MAS_API_TOKEN`;
refused without credentials off loopback); the OpenAPI document is at `/api/v1/openapi.json`, its reference at
`/api/v1/docs`. Errors are problem details (`mas.api.problems`). What happens is followed live as server-sent
events (`mas.api.stream`: `/api/v1/events`, `/api/v1/batches/{id}/events`). A user's style is read and corrected
item by item (`mas.api.style`).
"""

from __future__ import annotations

from fastapi import Depends, FastAPI
from fastapi.security import HTTPBasic, HTTPBearer

from mas.api import problems, stream, style
from mas.api.routes import router
from mas.config import Settings

VERSION = "1"


def create_api(settings: Settings) -> FastAPI:
    """The API app for `settings` (mounted by the gallery at /api/v1)."""
    # declared for the OpenAPI document (client generators learn how to authenticate); the gallery's gate
    # enforces them before a route runs
    documented = [Depends(HTTPBasic(auto_error=False)), Depends(HTTPBearer(auto_error=False))]
    api = FastAPI(
        title="mas studio API",
        version=VERSION,
        description="Submit and follow video production, act on batches, pick A/B winners, read memory, read and "
        "correct the user's style item by item.",
        dependencies=documented,
        servers=[{"url": "/api/v1"}],
    )
    api.state.settings = settings
    api.include_router(router)
    api.include_router(stream.router)
    api.include_router(style.router)
    api.state.streams = stream.Slots(settings.service.stream_max)  # this process's open event streams
    problems.install(api)
    return api
