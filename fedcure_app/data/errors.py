"""Errors raised while locating, reading or caching a dataset.

Every message is one line that names the file (or directory) at fault and what to do about it, so
the CLI can print it as is. All are :class:`ValueError` subclasses.
"""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset cannot be loaded; the message says which file and why."""


class MissingDatasetError(DatasetError):
    """The dataset's directory or files are not where they were looked for."""


class CorruptDatasetError(DatasetError):
    """A dataset file exists but cannot be parsed (bad magic, wrong length, bad compression…)."""


class ClientDataError(DatasetError):
    """A client's own data (``fedcure-client --data PATH``) cannot be used for the task: one
    line naming the file, row, column or class at fault (:mod:`fedcure_app.data.own`).

    ``code`` is the refusal's kind and ``count`` how many files, classes or values share it
    (None: not counted): all a client tells the cloud when it withdraws
    (:func:`fedcure_app.protocol.withdraw.withdraw_reason`); the line itself stays on the
    client."""

    def __init__(self, message: str, code: str = "data-refused", count: int | None = None
                 ) -> None:
        super().__init__(message)
        self.code, self.count = code, count
