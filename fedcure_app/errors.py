"""What every command line shares: the error type for a user's mistake, and the help format.

``fedcure`` (:mod:`fedcure_app.cli`) and the role commands (``fedcure-cloud``, ``fedcure-edge``,
``fedcure-client``) raise :class:`UsageError` for bad flags; each prints it as one line on stderr
and exits with code 2. Their ``--help`` pages use :class:`HelpFormatter`, which shows every
default, and their parsers (:class:`ArgumentParser`) report a malformed command line the same
way: one line naming the option, a pointer to ``--help``, exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import NoReturn

_CHOICE_RE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


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


def one_line_usage_error(prog: str, message: str) -> str:
    """argparse's complaint ``message`` about ``prog``'s command line as one line: the complaint,
    the nearest valid choice for a misspelt one, and where the usage is."""
    text = " ".join(message.split())
    m = _CHOICE_RE.search(text)
    if m:
        choices = [c.strip().strip("'") for c in m.group(2).split(",")]
        near = difflib.get_close_matches(m.group(1), choices, n=1)
        if near:
            text += f"; did you mean '{near[0]}'?"
    return f"{prog}: error: {text} (see {prog} --help)"


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with :class:`HelpFormatter` whose errors are one line on
    stderr (:func:`one_line_usage_error`) and exit code 2, instead of the usage block first;
    its sub-command parsers inherit both."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        print(one_line_usage_error(self.prog, message), file=sys.stderr)
        sys.exit(2)


__all__ = ["ArgumentParser", "HelpFormatter", "UsageError", "one_line_usage_error"]
