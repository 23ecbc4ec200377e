"""Text another process sent: the name rule, and escaping before it is logged or echoed.

A remotely supplied string (a client or edge name, an address, a task id, an error detail from
a peer) never reaches a log line or a refusal message as it came: :func:`printable` escapes
every character that is not printable (a control, format or bidi character, a line separator:
CR/LF, ESC, NUL, BEL, DEL, U+202E, ...) the way Python's ``repr`` writes it (``\\x1b``,
``\\u202e``) and keeps the rest as is, so no peer can forge a log line or reorder one on a
terminal; :func:`clip` is the quoted ``repr`` the cloud echoes in its refusals. Names (client
names, device profile names, edge addresses) must pass :func:`name_problem` at the cloud's
door. Standard library only: every role imports it.
"""

from __future__ import annotations

import unicodedata
from typing import Any

#: characters of a peer's text echoed in a refusal
ECHO = 40
#: characters of a peer's text written to a log line
LOG_CHARS = 300


def clip(text: Any, limit: int = ECHO) -> str:
    """``repr`` of what was sent, cut to ``limit`` characters (never echo a whole request)."""
    if isinstance(text, str):
        out = repr(text[: limit + 1])
        return out if len(text) <= limit else out[:-1] + "…" + out[-1]
    try:
        out = repr(text)
    except ValueError:  # an integer too long to print
        out = "<unprintable>"
    return out if len(out) <= limit else out[:limit] + "…"


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: Any, limit: int = LOG_CHARS) -> str:
    """``text`` (``str()`` of it) with every non-printable character escaped (``\\x1b``,
    ``\\u202e``) and the rest unchanged, cut to ``limit`` characters with "…": safe to log."""
    s = text if isinstance(text, str) else str(text)
    cut = len(s) > limit
    s = s[:limit]
    if not s.isprintable():
        s = "".join(ch if ch.isprintable() else _escape(ch) for ch in s)
    return s + "…" if cut else s


def name_problem(name: str) -> str | None:
    """Why ``name`` may not be a name, in one line naming the rule (None: it may).

    The rule: every character printable (Python's ``str.isprintable``: no control, format,
    bidi, surrogate, private-use or unassigned character, no line or paragraph separator, no
    space but U+0020), and one path component (no '/' or '\\\\', not '.' or '..')."""
    for i, ch in enumerate(name):
        if not ch.isprintable():
            return (f"has the non-printable character U+{ord(ch):04X} "
                    f"({unicodedata.category(ch)}) at {i}: names are printable text, no "
                    "control, format or bidi characters")
    if "/" in name or "\\" in name:
        return "has a path separator ('/' or '\\'): a name is one path component"
    if name.strip() in (".", ".."):
        return "is '.' or '..': a name is one path component"
    return None


__all__ = ["ECHO", "LOG_CHARS", "clip", "name_problem", "printable"]
