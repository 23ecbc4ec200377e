"""What a client tells the cloud when it withdraws (``Association.Withdraw``): a code from a
fixed set and a count, never a path, a file name or a file's content.

A client refuses its own data in one line naming the file, row or class at fault; that line
stays in the client's log. The cloud learns only :func:`withdraw_reason` of the refusal, such
as ``shape-mismatch: 20 files`` or ``unknown-class: 1 class``; the cloud keeps only what
:func:`known_reason` recognises (anything else is logged as ``unrecognised``). Pure functions.
"""

from __future__ import annotations

import re

#: Every withdraw code -> the unit its count is in ("" : the code is sent without a count).
WITHDRAW_CODES: dict[str, str] = {
    "shape-mismatch": "file",      # an image or array of another size than the task's
    "channel-mismatch": "file",    # an image of other channels than the task's (no convert)
    "unknown-class": "class",      # labels the task's class list lacks
    "not-finite": "value",         # a value that is not a finite float32
    "too-large": "file",           # an image or an array over the documented bounds
    "symlink-outside": "link",     # a symbolic link out of the client's PATH
    "unreadable": "file",          # a file that cannot be read or decoded
    "bad-labels": "",              # labels of the wrong type or length
    "bad-format": "",              # not a format the task takes (kind, columns, members)
    "no-samples": "",              # nothing left to train on
    "model-refused": "",           # the task's model does not build here
    "task-refused": "",            # the task is outside what a client takes
    "task-mismatch": "",           # the client's flags disagree with the cloud's run
    "read-failed": "",             # reading the data failed or took too long
    "data-refused": "",            # any other refusal of the data
}
#: A refusal's type name -> its code, for refusals that carry no ``code`` of their own.
_BY_TYPE: dict[str, str] = {
    "UsageError": "task-mismatch",
    "ConfigError": "task-refused",
    "ModelImportError": "model-refused",
    "ModelNotAllowed": "model-refused",
    "TaskFileError": "task-refused",
    "ClientError": "read-failed",
}
_REASON = re.compile(r"^([a-z-]{1,32})(?:: ([0-9]{1,12}) ([a-z]{1,12}))?$")


def reason_text(code: str, count: int | None = None) -> str:
    """``code`` (one of :data:`WITHDRAW_CODES`, else ``data-refused``) with ``count`` in its
    unit, plural when not 1: ``shape-mismatch: 20 files``; the code alone without a count or
    a unit."""
    if code not in WITHDRAW_CODES:
        code = "data-refused"
    unit = WITHDRAW_CODES[code]
    if count is None or not unit or count < 0:
        return code
    return f"{code}: {int(count)} {unit}{'' if count == 1 else 'es' if unit == 'class' else 's'}"


def withdraw_code(err: BaseException) -> tuple[str, int | None]:
    """The code and count of a refusal: its own ``code``/``count`` attributes when they are
    known (:class:`fedcure_app.data.errors.ClientDataError`), else by its type."""
    code = getattr(err, "code", None)
    if isinstance(code, str) and code in WITHDRAW_CODES:
        count = getattr(err, "count", None)
        return code, count if isinstance(count, int) else None
    return _BY_TYPE.get(type(err).__name__, "data-refused"), None


def withdraw_reason(err: BaseException) -> str:
    """The reason a client sends the cloud for the refusal ``err``: a code and a count
    (:func:`reason_text`), nothing of the message."""
    return reason_text(*withdraw_code(err))


def known_reason(text: str) -> str:
    """``text`` when it is a withdraw reason this module writes, else ``unrecognised`` (what
    the cloud keeps and logs of a reason a client sent)."""
    m = _REASON.match(text)
    if m is None or m.group(1) not in WITHDRAW_CODES:
        return "unrecognised"
    code, count = m.group(1), m.group(2)
    expected = reason_text(code, int(count) if count is not None else None)
    return text if expected == text else "unrecognised"


__all__ = ["WITHDRAW_CODES", "known_reason", "reason_text", "withdraw_code", "withdraw_reason"]
