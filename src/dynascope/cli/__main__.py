"""``python -m dynascope.cli`` (what ``torchrun ... -m dynascope.cli run`` starts)."""

from dynascope.cli import main

main()
