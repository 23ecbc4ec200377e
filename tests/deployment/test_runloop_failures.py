"""A background task of the cloud's run loop that fails is logged, not lost silently
(:func:`cloud_server.runloop._log_failure`): a watchdog or a loss handler that died quietly
would leave every later deadline unwatched."""

from __future__ import annotations

import asyncio
import logging

from cloud_server.runloop import _log_failure


async def _fails() -> None:
    raise RuntimeError("the watchdog broke")


async def _ends() -> None:
    return None


def test_a_background_task_that_raises_is_logged_with_its_traceback(caplog):
    async def main() -> None:
        for coro in (_fails(), _ends()):
            t = asyncio.ensure_future(coro)
            t.add_done_callback(_log_failure)
            await asyncio.wait([t])
        cancelled = asyncio.ensure_future(asyncio.sleep(10))
        cancelled.add_done_callback(_log_failure)
        cancelled.cancel()
        await asyncio.wait([cancelled])
        await asyncio.sleep(0)  # let the done callbacks run

    with caplog.at_level(logging.ERROR, logger="fedcure.cloud"):
        asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].exc_info is not None and "the watchdog broke" in str(errors[0].exc_info[1])
