"""`python -m mas.cli`: the `mas` command, for environments without the installed script."""

from mas.cli.root import main

main()
