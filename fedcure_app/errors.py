"""The one error type for a user's mistake on a command line, shared by every command.

``fedcure`` (:mod:`fedcure_app.cli`) and the role commands (``fedcure-cloud``, ``fedcure-edge``,
``fedcure-client``) raise :class:`UsageError` for bad flags; each prints it as one line on stderr
and exits with code 2.
"""

from __future__ import annotations


class UsageError(ValueError):
    """A mistake in what the user typed: printed as one line, exit code 2."""


__all__ = ["UsageError"]
