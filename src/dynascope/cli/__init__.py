"""The ``dynascope`` command.

One module per command group: :mod:`~dynascope.cli.run` (``run``, ``resume``),
:mod:`~dynascope.cli.inspect` (``show``, ``report``, ``inspect``),
:mod:`~dynascope.cli.compare`, :mod:`~dynascope.cli.study` (``study list``, ``study run``),
:mod:`~dynascope.cli.study_docs` (``study table``, ``study docs``) and
:mod:`~dynascope.cli.config` (``config validate``); ``_app.py`` assembles them into
:data:`app`, and ``_common.py`` holds the consoles, exit codes and the one-line error. Heavy
imports (torch, pandas, the studies) happen inside the commands, so ``dynascope --help`` and
``dynascope study list`` start without torch.

Exit codes: 0 success (a study whose claim did not hold still exits 0: a failed claim is a
scientific result); 1 unexpected error; 2 bad input (one line on stderr, nothing written), also
a run directory in use by another process; 3 a run diverged (its store is kept); 130 / 143 a
run stopped by SIGINT / SIGTERM after checkpointing (continue it with ``dynascope resume``).
"""

from __future__ import annotations

from ._app import app as app
from ._app import main as main
from ._app import split_set_pairs as split_set_pairs

__all__ = ["app", "main", "split_set_pairs"]
