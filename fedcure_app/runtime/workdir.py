"""A role's work folder: the user's ``--work-dir`` (kept), or a private temporary one that the
role removes when it exits, cleanly or on SIGTERM/SIGINT (the roles turn both into a clean
stop, :func:`fedcure_app.runtime.processes.role_start`).

    work, temporary = make_work_dir(args.work_dir, "fedcure-edge0-")
    try:
        ...  # start children that write under ``work``, stop them
    finally:
        drop_work_dir(work, temporary, secrets=[work / "superexec.secret"])

A secret file is removed in either case: it is made afresh for every start and is worth
nothing after its process, so it never outlives it (also not in a ``--work-dir``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("fedcure.workdir")


def make_work_dir(given: str | Path | None, prefix: str) -> tuple[Path, bool]:
    """``(folder, temporary)``: ``given`` (made if missing, kept at exit), or a fresh 0700
    folder under the system's temporary directory (``$TMPDIR``) that is the role's to remove."""
    if given:
        work = Path(given)
        work.mkdir(parents=True, exist_ok=True)
        return work.resolve(), False
    return Path(tempfile.mkdtemp(prefix=prefix)).resolve(), True


def drop_work_dir(work: Path | None, temporary: bool,
                  secrets: Iterable[Path | None] = ()) -> None:
    """Remove ``secrets``, and the whole of ``work`` when it is ``temporary``. Call it once the
    role's children are stopped; never raises (a failure is logged: the role is exiting)."""
    for secret in secrets:
        if secret is not None:
            try:
                Path(secret).unlink(missing_ok=True)
            except OSError as err:
                log.warning("could not remove the secret %s: %s", secret, err.strerror or err)
    if work is None or not temporary:
        return
    try:
        shutil.rmtree(work)
    except FileNotFoundError:
        return
    except OSError as err:
        log.warning("could not remove the temporary work folder %s: %s", work, err)
        return
    log.debug("removed the temporary work folder %s", work)


__all__ = ["drop_work_dir", "make_work_dir"]
