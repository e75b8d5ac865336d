"""Why a node could not be reached: Unreachable (AuthFailed when it refused every key), and
which failures of a connection attempt a retry can fix (a starting sshd, never a silent
address). engine/session.py and engine/bastions.py raise them."""

from __future__ import annotations

import socket

import paramiko

from nodeprep.errors import NodeprepError


class Unreachable(NodeprepError):
    pass


class AuthFailed(Unreachable):
    """The node answered and refused every key (and password) offered."""


def connect_error(e: BaseException, seconds: float, limit: float) -> tuple[str, bool]:
    """(what happened, whether a retry can fix it). A retry helps a node whose sshd is starting
    (refused, reset, closed during the banner); never a silent address: waiting again cannot
    make it answer, and every retry would add CONNECT_TIMEOUT to the run."""
    if isinstance(e, (socket.timeout, TimeoutError)) or seconds >= limit - 0.5:
        return (
            f"no answer within {limit:.0f} s "
            "(a silent address: the node is down or a firewall drops it)",
            False,
        )
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (no sshd listening yet?)", True
    if isinstance(e, (ConnectionResetError, EOFError, BrokenPipeError)):
        return f"connection reset ({type(e).__name__})", True
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        return str(e), True
    if isinstance(e, paramiko.SSHException):
        return f"ssh handshake failed: {e}", _transient(e)
    if isinstance(e, OSError):
        return f"{e.strerror or e} (errno {e.errno})", e.errno in (104, 111, 113)
    return f"{type(e).__name__}: {e}", False


def _transient(e: paramiko.SSHException) -> bool:
    msg = str(e)
    return any(
        s in msg
        for s in (
            "Error reading SSH protocol banner",
            "No existing session",
            "Connection reset",
            "timed out",
        )
    )
