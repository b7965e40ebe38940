"""The user-error type and how the command line shows it."""
import os
import re


class RouterLiteError(ValueError):
    """An error the user can fix; the message names the bad input (file, row, field, setting)."""


def debug_enabled() -> bool:
    """`router-lite --debug` (or ROUTER_LITE_DEBUG=1): user errors keep their stack traces."""
    return os.environ.get("ROUTER_LITE_DEBUG", "") not in ("", "0", "false")


def one_line(message: str) -> str:
    """A message on one line (a user error is printed as exactly one line)."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(message)).strip()
