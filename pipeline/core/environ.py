"""Environment variables set for the length of a block and restored afterwards, so a command run in process (the
CLI called from a test or a bench) leaves no switch behind for the next one."""
import contextlib
import os


def _apply(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def environ(**values: str | None):
    """Set each variable to its value (None: unset it) inside the block; afterwards each is as it was before."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _apply(values)
        yield
    finally:
        _apply(saved)
