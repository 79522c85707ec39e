"""`PtyTerminal`: a child process on a pseudo-terminal of a fixed size, for end-to-end tests.

A thread drains the child's output all the time (a child never blocks on a full terminal, even
while the test writes megabytes to it); writes are non-blocking with a deadline; every wait is
bounded and fails with the end of the screen text. `kill()` (in a `finally`) ends a child that
is still running.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import threading
import time
from typing import Callable

ANSI = re.compile(r"\x1b\[[0-9;?<=>]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]|[\r\x07\x08]")


class PtyTerminal:
    def __init__(self, argv: list[str], env: dict[str, str], *, rows: int = 32, cols: int = 100):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal is its stdin, stdout and stderr
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)  # never back into the test runner's code
        os.set_blocking(self.fd, False)
        self.exit_code: int | None = None
        self._output = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                if not select.select([self.fd], [], [], 0.1)[0]:
                    continue
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            except (OSError, ValueError):  # EIO: the child closed the terminal (or kill() did)
                return
            if not chunk:
                return
            with self._lock:
                self._output += chunk

    def mark(self) -> int:
        """The position reached in the output, for `text(since=...)`."""
        with self._lock:
            return len(self._output)

    def text(self, since: int = 0) -> str:
        """What the child has written (from `since`), decoded, without escape sequences."""
        with self._lock:
            raw = bytes(self._output[since:])
        return ANSI.sub("", raw.decode("utf-8", "replace"))

    def running(self) -> bool:
        if self.exit_code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code is None

    def _fail(self, what: str) -> AssertionError:
        state = "running" if self.running() else f"exited with status {self.exit_code}"
        return AssertionError(f"{what} (the child is {state}); its screen ends:\n{self.text()[-3000:]}")

    def wait_for(self, condition: Callable[[], object], what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if not self.running():
                raise self._fail(f"waiting for {what}")
            if time.monotonic() > deadline:
                raise self._fail(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.05)

    def wait_for_text(self, pattern: str, timeout: float = 120.0, since: int = 0) -> None:
        """Wait until `pattern` (a regex) is on the screen, written after position `since`."""
        regex = re.compile(pattern)
        self.wait_for(lambda: regex.search(self.text(since)), f"{pattern!r} on the screen", timeout)

    def write(self, data: bytes, timeout: float = 300.0) -> None:
        view, deadline = memoryview(data), time.monotonic() + timeout
        while view:
            _, ready, _ = select.select([], [self.fd], [], 0.1)
            if not self.running():
                raise self._fail(f"writing ({len(view):,} bytes left)")
            if time.monotonic() > deadline:
                raise self._fail(f"timed out after {timeout:g} s writing ({len(view):,} bytes left)")
            if ready:
                try:
                    view = view[os.write(self.fd, view[:65536]):]
                except BlockingIOError:
                    pass

    def wait_exit(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                raise self._fail(f"timed out after {timeout:g} s waiting for the child to exit")
            time.sleep(0.05)
        return self.exit_code

    def kill(self) -> None:
        """End the child if it still runs, and release the terminal."""
        if self.running():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        self._reader.join(10)
        os.close(self.fd)
