"""Signals for `serve`, made safe: the handler runs no Python that locks, logs or allocates much.

    SIGTERM/SIGINT/SIGHUP --C handler--> the signal number, one byte --> a pipe --> relay thread --> action

Python runs signal handlers between bytecodes of the main thread, which may be inside Event.set() or a
logging call holding a lock at that moment: a handler that sets an Event or logs can deadlock, and a storm of
SIGHUPs re-entered the handler until RecursionError killed the daemon. Here set_wakeup_fd writes each signal's
number to a pipe from C, the Python-level handler does nothing, and a plain thread reads the pipe and runs the
action (request a reload, stop) where taking locks is fine. A full pipe drops bytes, never blocks: a thousand
queued SIGHUPs are one reload.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

_SENTINEL = b"\x00"  # no signal has number 0: the relay thread's cue to end


def _nothing(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: the byte in the wakeup pipe carries the signal."""


class SignalRelay:
    """Runs an action per signal on a thread of its own; install() in the main thread, close() when done."""

    def __init__(self, actions: Mapping[int, Callable[[], None]]) -> None:
        self._actions = {int(s): a for s, a in actions.items()}
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous: dict[int, Any] = {}
        self._old_fd: int | None = None  # the wakeup fd before install(); None until installed
        self._thread = threading.Thread(target=self._relay, name="sglang-oom-signals", daemon=True)

    def install(self) -> None:
        """Point the signals at the pipe and start the relay thread (main thread only)."""
        self._thread.start()
        self._old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for signum in self._actions:
            self._previous[signum] = signal.signal(signum, _nothing)

    def close(self) -> None:
        """Restore the previous handlers, end the relay thread and close the pipe; safe to call twice."""
        if self._write < 0:
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._old_fd is not None:
            signal.set_wakeup_fd(self._old_fd)
            self._old_fd = None
        with contextlib.suppress(OSError):
            os.set_blocking(self._write, True)
            os.write(self._write, _SENTINEL)
        if self._thread.is_alive():
            self._thread.join(5.0)
        os.close(self._write)
        os.close(self._read)
        self._write = self._read = -1

    def _relay(self) -> None:
        while True:
            data = os.read(self._read, 4096)
            if not data:
                return
            for signum in dict.fromkeys(data):  # a burst of one signal is acted on once per read
                if signum == 0:
                    return
                action = self._actions.get(signum)
                if action is not None:
                    action()
