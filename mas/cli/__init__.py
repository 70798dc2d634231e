"""The `mas` command line: run the studio, put work in, watch it.

One module per group of commands; `root` holds the `mas` group itself. Commands read through the query
functions of the core (`mas.reports.queries`) and act through its functions (`mas.pipeline.production`, `mas.runtime.remote`,
`mas.runtime.foreground`, ...): no SQL and no Redis keys here. Core modules that load the Celery app (which reads
the settings on import) are imported inside the commands, so a bad setting is one line, not a traceback.
"""

from mas.cli.root import main

__all__ = ["main"]
