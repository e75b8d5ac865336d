"""The TCP socket under every ssh connection nodeprep opens: Nagle off, the dead-peer rule kept
by the kernel, and how the connection ended (silent, or closed by the node)."""

from __future__ import annotations

import socket

_TCP_CLOSE = 7  # tcp_states.h: aborted (the dead-peer rule fired, or a reset)


class _Socket(socket.socket):
    """A socket that remembers how it ended. paramiko reports every end as an EOFError, but the
    dead-peer rule's end must read "silent", a node that closed the connection must not. When
    the kernel aborts a connection for TCP_USER_TIMEOUT, recv returns end-of-file (measured on
    the lab's kernel, 2026-11-25) with the socket in TCP_CLOSE; a peer's FIN leaves it in
    CLOSE_WAIT, a reset raises ECONNRESET."""

    error: OSError | None = None
    aborted: bool = False

    def _seen(self, call, *a):
        try:
            return call(*a)
        except OSError as e:
            if not isinstance(e, socket.timeout):
                self.error = self.error or e
            raise

    def recv(self, *a):
        data = self._seen(super().recv, *a)
        if not data and self.error is None:
            try:
                self.aborted = (
                    self.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == _TCP_CLOSE
                )
            except OSError:
                pass
        return data

    def send(self, *a):
        return self._seen(super().send, *a)

    def sendall(self, *a):
        return self._seen(super().sendall, *a)


def _connected(address: str, port: int, timeout: float) -> _Socket:
    """socket.create_connection, with our socket class."""
    err = None
    for family, kind, proto, _name, where in socket.getaddrinfo(
        address, port, 0, socket.SOCK_STREAM
    ):
        sock = _Socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            return sock
        except OSError as e:
            err = e
            sock.close()
    raise err or OSError(f"cannot resolve {address}")


def connect(address: str, port: int, timeout: float, silent_after: float) -> socket.socket:
    """A connected TCP socket with Nagle off and a dead-peer rule.

    Nagle: SSH exchanges many small messages (kex, auth, channel open + exec); with Nagle on,
    a second small write waits for the first one's ACK, which the peer delays up to 40 ms:
    measured on the lab, connect 65 -> 19 ms and one command's round trip 44 -> 2 ms.

    Dead peer: a node that loses power, its link or its kernel sends no RST: its packets just
    stop, and a read waits for ever. The kernel keeps watch instead of a thread per node: TCP
    keepalives probe an idle connection every SILENT_AFTER/3 s, and TCP_USER_TIMEOUT drops the
    connection when sent data or a probe stays unacknowledged SILENT_AFTER s (Linux, tcp(7)).
    A node busy on a long command still acknowledges the probes: only silence counts."""
    sock = _connected(address, port, timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    every = max(1, int(silent_after // 3))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (
        ("TCP_KEEPIDLE", every),
        ("TCP_KEEPINTVL", every),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", int(silent_after * 1000)),
    ):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    return sock
