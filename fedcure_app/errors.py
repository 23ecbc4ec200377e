"""What every command line shares: the error type for a user's mistake, and the help format.

``fedcure`` (:mod:`fedcure_app.cli`) and the role commands (``fedcure-cloud``, ``fedcure-edge``,
``fedcure-client``) raise :class:`UsageError` for bad flags; each prints it as one line on stderr
and exits with code 2. Their ``--help`` pages use :class:`HelpFormatter`, which shows every
default.
"""

from __future__ import annotations

import argparse


class UsageError(ValueError):
    """A mistake in what the user typed: printed as one line, exit code 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: V)`` after every option that has a default and does not already say
    it, and ``(default: none)`` after an optional value option without one; flags (``False``)
    and required options say nothing. ``tests/test_cli_help.py`` walks every parser."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text.lower()
            or not action.option_strings
            or action.required
            or (action.nargs == 0 and (action.default is None or action.default is False))
            or action.default is argparse.SUPPRESS
        ):
            return text
        if action.default is None:
            return f"{text} (default: none)".lstrip()
        return f"{text} (default: %(default)s)".lstrip()


__all__ = ["HelpFormatter", "UsageError"]
