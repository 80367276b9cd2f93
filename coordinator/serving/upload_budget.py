"""What bounds the coordinator's memory for uploads as silos are added: a budget and a window.

Masked inputs are summed as they arrive (crypto/secagg_server.py), but each must first be read
whole from its stream, and every silo uploads at about the same moment. Without a bound, N
uploads are assembled at once: 200 silos of a 1 M-parameter model held 1.6 GB before the first
was summed (bench/secagg_scale.py). A handler now takes its tensor's declared size from the
budget before reading past the first chunk; when the budget is spent it waits, and gRPC's flow
control holds its sender back meanwhile. One tensor larger than the whole budget still goes,
alone, so no plan is refused for it.

The budget bounds what handlers assemble; below them gRPC buffers each stream's unread data up
to its flow-control window. With gRPC's bandwidth-delay probing that window grows to megabytes
on a fast link, per connection: 200 silos waiting their turn held 300 MB more on loopback. So
the coordinator fixes the window instead (`[server] stream_window_kb`, 64 KiB by default, gRPC's
own starting window): each waiting silo costs that much. A link with a long round trip moves at
most one window per round trip per stream, so a consortium over a wide-area network may raise
it, paying the window once per connected silo.

The asyncio server waits with `hold_async`, which parks the handler's coroutine instead of a
thread; both ways of waiting share one budget.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager


def stream_window_options(window_kb: int) -> list[tuple[str, int]]:
    """gRPC server options: a fixed per-stream receive window instead of a probed one."""
    return [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", window_kb << 10)]


class UploadBudget:
    """Bytes of uploads in assembly, bounded by a limit; takers wait their turn."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 1:
            raise ValueError(f"an upload budget must be positive, got {limit_bytes}")
        self.limit = limit_bytes
        self.used = 0
        self.peak = 0         # the most ever held at once (for tests and benchmarks)
        self.waited = 0       # how many takers had to wait
        self.on_wait: Callable[[], None] | None = None    # told of each taker that waits
        self._cond = threading.Condition()
        # What asyncio takers wait on: set, on their loop, when bytes go back.
        self._returned: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    @contextmanager
    def hold(self, size: int, *, still_wanted: Callable[[], bool] = lambda: True,
             poll_s: float = 0.5) -> Iterator[bool]:
        """Hold `size` bytes for the body; yields False if no longer wanted while waiting.

        `still_wanted` is asked while waiting (the caller's stream is still open, the server
        is not stopping); when it says no, the body runs holding nothing and learns so.
        """
        size = max(0, size)
        with self._cond:
            if not self._fits(size):
                self.waited += 1
                if self.on_wait is not None:
                    self.on_wait()
            while not self._fits(size):
                if not still_wanted():
                    break
                self._cond.wait(poll_s)
            granted = self._fits(size)
            if granted:
                self.used += size
                self.peak = max(self.peak, self.used)
        try:
            yield granted
        finally:
            if granted:
                self._give_back(size)

    @asynccontextmanager
    async def hold_async(self, size: int, *, still_wanted: Callable[[], bool] = lambda: True,
                         poll_s: float = 0.5) -> AsyncIterator[bool]:
        """`hold` for a coroutine on an event loop: waits without holding a thread."""
        size = max(0, size)
        granted = self._take(size, count_wait=True)
        while not granted and still_wanted():
            with self._cond:
                if self._returned is None:
                    self._returned = (asyncio.get_running_loop(), asyncio.Event())
                returned = self._returned[1]
            try:
                await asyncio.wait_for(returned.wait(), poll_s)
            except TimeoutError:
                pass
            granted = self._take(size, count_wait=False)
        try:
            yield granted
        finally:
            if granted:
                self._give_back(size)

    def _take(self, size: int, *, count_wait: bool) -> bool:
        """Take size bytes if they fit now; a first refusal counts as a wait."""
        with self._cond:
            if self._fits(size):
                self.used += size
                self.peak = max(self.peak, self.used)
                return True
            if count_wait:
                self.waited += 1
                if self.on_wait is not None:
                    self.on_wait()
            return False

    def _give_back(self, size: int) -> None:
        """Return size bytes and wake every taker waiting for them, threads and coroutines."""
        with self._cond:
            self.used -= size
            self._cond.notify_all()
            returned, self._returned = self._returned, None
        if returned is not None:
            loop, event = returned
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                event.set()
            else:
                try:
                    loop.call_soon_threadsafe(event.set)
                except RuntimeError:
                    pass        # that loop is closed: nobody waits on it any more

    def _fits(self, size: int) -> bool:
        # Alone, any size goes: a tensor above the limit must not wait forever.
        return self.used == 0 or self.used + size <= self.limit
