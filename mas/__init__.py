"""mas: an autonomous multi-agent AI video studio run as a Celery distributed job system.

`celery -A mas worker` finds the Celery app through `mas.app`, made from the environment's settings on first
access only, so that `import mas` stays cheap and reads no settings.
"""

__all__ = ["app"]


def __getattr__(name: str):
    if name == "app":
        from mas.runtime.app import default_app

        return default_app()
    raise AttributeError(name)
