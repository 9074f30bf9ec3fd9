"""``python -m dynascope``: the ``dynascope`` command."""

from dynascope.cli import main

main()
