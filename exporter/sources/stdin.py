"""stdin as a source: `python -m sglang.launch_server … 2>&1 | sglang-oom-exporter serve -`.

A thread reads the pipe, writes every byte through to stdout unchanged (so the exporter can sit in a
pipeline), and queues the bytes for the pipeline thread, waking it at once: SGLang must never block on
its own log writes because the exporter is slow to look. The queue is bounded, so memory is too.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import BinaryIO

CHUNK = 65536
MAX_QUEUED = 256  # chunks (16 MiB): a radix-tree dump burst fits while the loop catches up


class StdinPump:
    """Reads a binary stream in a daemon thread; drain() hands the bytes to the pipeline thread."""

    def __init__(self, stream: BinaryIO, passthrough: BinaryIO | None, wake: Callable[[], None] = lambda: None) -> None:
        self._stream = stream
        self._out = passthrough
        self._wake = wake
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=MAX_QUEUED)
        self._thread: threading.Thread | None = None
        self.done = False

    def start(self) -> None:
        """Start the reader thread."""
        self._thread = threading.Thread(target=self._run, name="stdin-reader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Nothing to join: the reader is a daemon thread blocked in read() until the pipe closes."""

    def drain(self) -> tuple[list[bytes], bool]:
        """The chunks read since the last call, and whether the stream has ended."""
        chunks: list[bytes] = []
        while not self.done:
            try:
                data = self._queue.get_nowait()
            except queue.Empty:
                break
            if data is None:
                self.done = True
            else:
                chunks.append(data)
        return chunks, self.done

    def _run(self) -> None:
        fd = self._stream.fileno()
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                data = b""
            if self._out is not None and data:
                try:
                    self._out.write(data)
                    self._out.flush()
                except (OSError, ValueError):
                    self._out = None  # the downstream of the pipe went away; keep counting
            self._queue.put(data or None)
            self._wake()
            if not data:
                return
