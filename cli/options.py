"""What several subcommands read the same way (no subcommand imports another's module for it)."""
import os
from pathlib import Path


def use_override(args) -> None:
    """`--override FILE`: merged over the profile wherever it is read in this process (ROUTER_LITE_OVERRIDE)."""
    if getattr(args, "override", None):
        from pipeline.profile import OVERRIDE_ENV

        os.environ[OVERRIDE_ENV] = str(Path(args.override).expanduser().resolve())
