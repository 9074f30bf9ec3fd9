"""``dynascope config validate``: check a run config, print it resolved."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._common import Overrides, console, fail, print_line


def config_validate(
    file: Annotated[Path, typer.Argument(help="run config (YAML)")],
    set_: Overrides = None,
) -> None:
    """Validate a run config (with overrides); print it resolved, with defaults filled in."""
    import yaml

    from dynascope.config import ConfigError, load_config

    try:
        cfg = load_config(file, set_ or [])
    except ConfigError as err:
        fail(str(err))
    print_line(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    console.print("config is valid", style="green")
