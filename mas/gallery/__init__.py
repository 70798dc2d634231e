"""`mas serve`: a small local web gallery of batches, series, videos, A/B tests and memory.

Starlette renders Jinja2 pages straight from Postgres; a few lines of plain JavaScript follow the JSON
API's event stream for live progress, so there is no front-end build. It binds to loopback by default; beyond
loopback it refuses to start without MAS_GALLERY_USER and MAS_GALLERY_PASSWORD, and with them set every
request needs them (HTTP basic auth).
"""

from mas.gallery.app import GalleryError, create_app, serve, server

__all__ = ["GalleryError", "create_app", "serve", "server"]
