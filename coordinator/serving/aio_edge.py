"""How the asyncio gRPC handlers call the thread-safe core: on a small fixed pool of threads.

The coordinator's gRPC server runs on one event loop (coordinator/serving/service.py). Anything that
takes the core's lock, writes the audit log or spends CPU (unmasking, reassembling uploads) runs
on `CorePool`'s few threads, so the loop never blocks and the number of threads does not grow
with the number of silos. Refusals are translated into status codes here, once (STYLE.md 10).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent import futures
from typing import Any, NoReturn

import grpc

from trellis.coordinator.rounds.errors import RoundError
from trellis.crypto.errors import CryptoError
from trellis.protos.codec import CodecError

# Enough for the core's work to overlap uploads being reassembled; the core's lock serialises
# the round logic itself.
CORE_THREADS = 8
_STATUS = {
    "out_of_phase": grpc.StatusCode.FAILED_PRECONDITION,
    "duplicate": grpc.StatusCode.ALREADY_EXISTS,
    # Not taking part in *this attempt* is transient (a laggard sits out a retry); only a
    # certificate the plan does not admit is PERMISSION_DENIED (see the service's _caller).
    "not_participant": grpc.StatusCode.FAILED_PRECONDITION,
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
}


class Refused(Exception):
    """A call refused with this status code and message (raised off the loop, sent on it)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CorePool:
    """The fixed threads the handlers hand their work to, with errors translated."""

    def __init__(self, threads: int = CORE_THREADS) -> None:
        self.executor = futures.ThreadPoolExecutor(max_workers=threads,
                                                   thread_name_prefix="core")

    async def call(self, context: grpc.aio.ServicerContext, fn: Callable[..., Any],
                   *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) on the pool; a refusal aborts the call with its status."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor,
                                              functools.partial(fn, *args, **kwargs))
        except (RoundError, CodecError, CryptoError, Refused) as exc:
            await abort(context, exc)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn on the pool without waiting (or here, once the pool has shut down)."""
        try:
            self.executor.submit(fn, *args)
        except RuntimeError:
            fn(*args)

    def shutdown(self) -> None:
        """Wait for the work handed over, then end the threads."""
        self.executor.shutdown(wait=True)


async def guarded(context: grpc.aio.ServicerContext, fn: Callable[..., Any], *args: Any,
                  **kwargs: Any) -> Any:
    """fn(*args, **kwargs) here, on the loop (cheap decoding); a refusal aborts the call."""
    try:
        return fn(*args, **kwargs)
    except (RoundError, CodecError, CryptoError, Refused) as exc:
        await abort(context, exc)


async def abort(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
    """End the call with the status code and safe message of a refusal."""
    if isinstance(exc, RoundError):
        code, details = _STATUS[exc.kind], str(exc)
    elif isinstance(exc, Refused):
        code, details = exc.code, exc.details
    else:
        code, details = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    await context.abort(code, details)
    raise AssertionError("context.abort returned")    # it raises; for the type checker


class ChangeSignal:
    """Wakes the coroutines of one event loop that wait for a change made on other threads.

    `listener(loop)` is the callback a thread-safe owner (the core, the job host) calls on every
    change; a coroutine awaits `next_change()` (taken before it looks, so no change is missed).
    """

    def __init__(self) -> None:
        self._changed: asyncio.Event | None = None

    def listener(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """A callback, safe from any thread and never blocking, that wakes the waiters."""

        def changed() -> None:
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:
                pass            # the loop has closed: nobody is waiting any more

        return changed

    def next_change(self) -> asyncio.Event:
        """The event the next change sets (on the loop's thread)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
