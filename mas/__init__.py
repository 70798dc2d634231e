"""mas: an autonomous multi-agent AI video studio run as a Celery distributed job system.

`celery -A mas worker` finds the Celery app through `mas.app`, imported on first access only, so that
`import mas` stays cheap for the CLI.
"""

__all__ = ["app"]


def __getattr__(name: str):
    if name == "app":
        from mas.celery_app import app

        return app
    raise AttributeError(name)
