"""Errors a user can cause. The CLI turns them into one line and exit code 2."""


class StallscopeError(Exception):
    """Base class: the message is shown to the user as is, without a traceback."""

    exit_code = 2


class UsageError(StallscopeError):
    """A flag, path or value the user gave is wrong; the message names it and what was expected."""


class DataError(StallscopeError):
    """The user's data cannot be used (empty tree, no images, unreadable manifest, ...)."""
