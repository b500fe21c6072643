"""`python -m traceanalyzer.cli`: the `traceanalyzer` command."""

from . import main

main()
