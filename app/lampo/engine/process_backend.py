"""`ProcessBackend`: a `Backend` that runs in a process of its own, for the terminal interface.

The interface renders Markdown, lays out and paints in Python, holding the interpreter's lock for
most of every frame while a reply streams. A backend in the same process runs its generation loop
in a worker thread that needs that lock between every pair of engine calls (to queue the next
decode step, to draft, to verify), so the GPU waits for the interface: measured with the chat app
on a modelled GPU, the 35B-A3B's 517 tok/s step gave 146 tok/s on the screen, 502 with the
backend apart (docs/benchmarks.md, "The chat app on a modelled GPU"). Here the backend lives in a
child process whose generation loop has its interpreter to itself; the events cross a pipe, which
buffers them while the interface is busy, so the GPU never waits for a frame.

The child is started with `spawn` (no inherited threads or CUDA state) and builds the backend
with `factory(say)`, a picklable callable; its `say` lines come back as they are said, and an
exception there is raised by the constructor. Whatever the child prints (warnings, native
messages) goes to `log`, which the interface's terminal never sees. `generate` raises what the
child's `generate` raised before any work (ContextOverflow, a bad request) and then yields its
events; `cancel` is
passed on while it streams. A consumer that stops early cancels the child's call and waits for
its end, so the next call starts clean. If the child dies (a crash in the engine), the running
call raises `BackendProcessError` with its exit code, as any failed call does (the session keeps
the partial reply), and so does every later call.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
from pathlib import Path
from typing import Callable, Iterator

from lampo.engine.protocol import BackendInfo, Event, GenerationRequest

POLL_S = 0.02  # how often a waiting parent passes a cancel on and checks that the child lives


class BackendProcessError(RuntimeError):
    """The backend's process ended or could not be reached."""


def _portable(e: BaseException) -> BaseException:
    """`e` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any exception that does not round-trip
        return RuntimeError(f"{type(e).__name__}: {e}")


def _serve(conn, factory, cancel, log: Path | None) -> None:
    """The child: build the backend, then answer the parent's requests until it closes. Its
    stdout and stderr (Python's and native code's) go to `log`, not to the interface's terminal."""
    if log is not None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # this run's output only
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    try:
        backend = factory(lambda text: conn.send(("say", text)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("failed", _portable(e)))
        return
    conn.send(("ready", backend.info))
    try:
        while True:
            try:
                kind, *rest = conn.recv()
            except EOFError:  # the parent went away
                return
            if kind == "generate":
                try:
                    events = backend.generate(rest[0], cancel)
                except Exception as e:  # noqa: BLE001 - refused before any work: raised by the parent
                    conn.send(("refused", _portable(e)))
                    continue
                conn.send(("started",))
                try:
                    for event in events:
                        conn.send(("event", event))
                except Exception as e:  # noqa: BLE001 - the call failed: raised by the parent's iterator
                    conn.send(("raise", _portable(e)))
                    continue
                conn.send(("end",))
            elif kind == "reset":
                backend.reset()
                conn.send(("done",))
            elif kind == "close":
                return
    finally:
        backend.close()


class ProcessBackend:
    def __init__(self, factory: Callable[[Callable[[str], None]], object], *,
                 say: Callable[[str], None] | None = None, log: Path | None = None):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._cancel = ctx.Event()
        self._lock = threading.Lock()  # one exchange with the child at a time
        self._log = log
        self._proc = ctx.Process(target=_serve, args=(child, factory, self._cancel, log), name="lampo-backend",
                                 daemon=True)
        self._proc.start()
        child.close()
        while True:
            kind, value = self._recv()
            if kind == "say":
                if say is not None:
                    say(value)
            elif kind == "ready":
                self._info: BackendInfo = value
                return
            else:  # "failed"
                self._proc.join()
                raise value

    @property
    def info(self) -> BackendInfo:
        return self._info

    def _ended(self) -> BackendProcessError:
        where = f"; its output is in {self._log}" if self._log is not None else ""
        return BackendProcessError(f"the backend process ended (exit code {self._proc.exitcode}){where}")

    def _send(self, message) -> None:
        try:
            self._conn.send(message)
        except OSError:
            self._proc.join(timeout=5)
            raise self._ended() from None

    def _recv(self, cancel: threading.Event | None = None):
        """The child's next message; passes `cancel` on while waiting for it."""
        while True:
            if cancel is not None and cancel.is_set():
                self._cancel.set()
            if self._conn.poll(POLL_S):
                break
            if not self._proc.is_alive() and not self._conn.poll(0):
                raise self._ended()
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=5)
            raise self._ended() from None

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        self._lock.acquire()
        try:
            self._cancel.clear()
            self._send(("generate", request))
            reply = self._recv()
        except BaseException:
            self._lock.release()
            raise
        if reply[0] == "refused":
            self._lock.release()
            raise reply[1]
        return self._events(cancel)

    def _events(self, cancel: threading.Event) -> Iterator[Event]:
        ended = False
        try:
            while True:
                message = self._recv(cancel)
                if message[0] in ("end", "raise"):
                    ended = True
                    if message[0] == "raise":
                        raise message[1]
                    return
                yield message[1]
        finally:
            try:
                if not ended and self._proc.is_alive():  # the consumer stopped early: end the child's call
                    self._cancel.set()
                    while self._recv()[0] not in ("end", "raise"):
                        pass
            finally:
                self._lock.release()

    def reset(self) -> None:
        with self._lock:
            self._send(("reset",))
            self._recv()

    def close(self) -> None:
        with self._lock:
            if self._proc.is_alive():
                try:
                    self._conn.send(("close",))
                except OSError:
                    pass
            self._proc.join(timeout=30)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
            self._conn.close()
