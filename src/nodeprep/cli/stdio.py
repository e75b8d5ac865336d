"""A reader that goes away is not an error: `invoke facts | head -1`, a pager quit early, a
terminal pipe closed under a training run.

`install()` (called once, when the cli is imported: tasks.py imports it before Invoke prints
anything, `--list` included) puts new sys.stdout and sys.stderr objects over fds 1 and 2
whose lowest layer is `_Raw`: a write that gets EPIPE points that fd at /dev/null (the recipe
of the `signal` module's "Note on SIGPIPE") and succeeds, and so does every write after it.
So no writer ever sees BrokenPipeError: print(), the display (rich's included), Invoke's own
output and its runner threads (the remote lines Fabric streams), and the interpreter's final
flush at exit. The command goes on with its output discarded and exits with its own code.

SIGPIPE stays ignored (Python's default): the ssh sockets of the run must fail as EPIPE
errors, not kill the process. Only fds 1 and 2 get this treatment, and only when sys.stdout /
sys.stderr are still the interpreter's own (a test runner's capture is left alone).
"""

from __future__ import annotations

import io
import os
import sys
import threading

_lost: set[int] = set()  # fds whose reader went away (now /dev/null)
_lock = threading.Lock()


class _Raw(io.FileIO):
    """fd 1 or 2, unbuffered, that swallows the reader's departure."""

    def write(self, b) -> int:
        try:
            return super().write(b)
        except (BrokenPipeError, ConnectionResetError):
            discard(self.fileno())
            return super().write(b)  # to /dev/null: all of it


def discard(fd: int) -> None:
    """From now on what goes to FD goes to /dev/null (children started later inherit that)."""
    with _lock:
        if fd in _lost:
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        _lost.add(fd)


def stdout_lost() -> bool:
    """Has stdout's reader gone away (for a command that only shows things, a reason to stop)?"""
    return 1 in _lost


def install() -> None:
    """Guard fds 1 and 2 (idempotent)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        if old is None or old is not getattr(sys, f"__{name}__") or isinstance(_raw_of(old), _Raw):
            continue
        try:
            if old.fileno() != fd:
                continue
        except (OSError, ValueError, AttributeError):
            continue
        _flush(old, fd)
        new = _wrap(old, fd)
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def _raw_of(stream):
    buf = getattr(stream, "buffer", None)
    return getattr(buf, "raw", buf)


def _flush(old, fd: int) -> None:
    """What the old object holds goes out now (or to /dev/null): it must have nothing left to
    flush, and fail on, when it is dropped."""
    try:
        old.flush()
    except (BrokenPipeError, ConnectionResetError):
        discard(fd)
        old.flush()


def _wrap(old, fd: int) -> io.TextIOWrapper:
    """A stream like OLD (encoding, errors, buffering as Python set them up) over `_Raw`."""
    raw = _Raw(fd, "wb", closefd=False)
    buffered = hasattr(old.buffer, "raw")  # no: python -u / PYTHONUNBUFFERED
    return io.TextIOWrapper(
        io.BufferedWriter(raw) if buffered else raw,
        encoding=old.encoding,
        errors=old.errors,
        newline="\n",
        line_buffering=old.line_buffering,
        write_through=old.write_through,
    )
