class RouterLiteError(ValueError):
    """An error the user can fix; the message names the bad input."""
