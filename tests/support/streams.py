"""Reading a process's output stream in the background."""

from __future__ import annotations

import trio


class StreamLog:
    """What a subprocess writes to a pipe (its stderr), kept as it comes.

    Run `collect` as a task; then a test can wait for a line to appear, or
    for the end of the stream, with a bound against hangs.
    """

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.data = b""
        self._stream = stream
        self._changed = trio.Event()
        self._closed = trio.Event()

    async def collect(self) -> None:
        while data := await self._stream.receive_some():
            self.data += data
            self._changed.set()
            self._changed = trio.Event()
        self._closed.set()

    async def wait_for(self, text: str, *, timeout: float) -> None:
        with trio.fail_after(timeout):
            while text.encode() not in self.data:
                await self._changed.wait()

    async def wait_closed(self, *, timeout: float) -> None:
        with trio.fail_after(timeout):
            await self._closed.wait()
