"""The decisions behind "a node that goes silent or fills its disk never hangs a run": which
connection errors a retry can fix, the socket's dead-peer rule, the room a node needs and the
reason in numbers, a push's floor rate. The lab cases are tests/integration/test_silence.py."""

from __future__ import annotations

import importlib.util
import socket
import time
from pathlib import Path

import paramiko
import pytest

from nodeprep.engine.connect_errors import connect_error
from nodeprep.engine.steps import Room
from nodeprep.engine.tcp import connect as _socket
from nodeprep.errors import NodeprepError
from nodeprep.ops.provision import room


@pytest.mark.parametrize(
    "error, seconds, retry, says",
    [
        (socket.timeout("timed out"), 10.0, False, "no answer within 10 s"),
        (TimeoutError(), 3.0, False, "no answer within 10 s"),
        (
            paramiko.SSHException("Error reading SSH protocol banner"),
            10.0,
            False,
            "no answer within 10 s",
        ),
        (ConnectionRefusedError(111, "Connection refused"), 0.01, True, "connection refused"),
        (ConnectionResetError(104, "Connection reset by peer"), 0.2, True, "connection reset"),
        (EOFError(), 0.1, True, "connection reset"),
        (
            paramiko.SSHException("Error reading SSH protocol banner"),
            0.3,
            True,
            "ssh handshake failed",
        ),
        (
            paramiko.SSHException("Incompatible ssh peer (no acceptable kex algorithm)"),
            0.3,
            False,
            "ssh handshake failed",
        ),
        (OSError(113, "No route to host"), 0.5, True, "No route to host"),
        (OSError(22, "Invalid argument"), 0.5, False, "Invalid argument"),
    ],
)
def test_only_what_a_retry_can_fix_is_retried(error, seconds, retry, says):
    why, again = connect_error(error, seconds, 10.0)
    assert again is retry and says in why


def test_the_socket_carries_the_dead_peer_rule():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        sock = _socket("127.0.0.1", server.getsockname()[1], 5, 15)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 15000
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        sock.close()
    finally:
        server.close()


FS = {
    "dir": "/home/u",
    "mount": "/home",
    "free": 38 * 2**20,
    "size": 10 * 2**30,
    "inodes_free": 90000,
    "writable": True,
    "readonly": False,
}


@pytest.mark.parametrize(
    "fact, needs, says",
    [
        (
            FS,
            [Room("~/.nodeprep/venv", int(1.4 * 2**30), 27000, what="the venv")],
            "no space on /home: 38 MiB free, the venv needs 1.4 GiB",
        ),
        (
            FS,
            [
                Room("~/w", 30 * 2**20, 28, what="26 wheels"),
                Room("~/v", 20 * 2**20, 100, what="the venv"),
            ],
            "no space on /home: 38 MiB free, 26 wheels and the venv need 50 MiB",
        ),
        (
            {**FS, "free": 2**40, "inodes_free": 500},
            [Room("~/v", 2**20, 27000, what="the venv")],
            "no inodes left on /home: 500 free, the venv needs 27000",
        ),
        (
            {**FS, "readonly": True, "writable": False},
            [Room("~/v", 1, 1, what="the venv")],
            "read-only file system /home (where /home/u is)",
        ),
        (
            {**FS, "writable": False},
            [Room("~/v", 1, 1, what="the venv")],
            "no permission to write /home/u",
        ),
    ],
)
def test_no_room_is_said_with_the_numbers(fact, needs, says):
    assert room.problem(fact, needs).startswith(says)


def test_room_is_enough_or_unknown():
    assert room.problem(FS, [Room("~/v", 2**20, 10, what="the venv")]) is None
    assert (
        room.problem({**FS, "inodes_free": None}, [Room("~/v", 2**20, 10**9, what="x")]) is None
    )  # btrfs
    assert room.problem(None, [Room("~/v", 2**40, 1, what="x")]) is None  # unread: the step says


def test_steps_on_one_file_system_are_added_up():
    rooms = {"~/w": FS, "~/v": FS, "/scratch/v": {**FS, "mount": "/scratch", "free": 2**40}}
    wanted = [
        (0, Room("~/w", 30 * 2**20, 1, what="26 wheels")),
        (2, Room("~/v", 20 * 2**20, 1, what="the venv")),
        (3, Room("/scratch/v", 2**30, 1, what="another venv")),
    ]
    bad = room.problems(rooms, wanted)
    assert set(bad) == {0, 2} and bad[0] == bad[2]


def _wheelhouse_role():
    path = Path(__file__).resolve().parents[2] / "roles" / "wheelhouse" / "role.py"
    spec = importlib.util.spec_from_file_location("wheelhouse_role_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_push_below_the_floor_rate_is_given_up(monkeypatch):
    pace = _wheelhouse_role()._Pace("worker-1")
    pace(50 * 2**20, 100 * 2**20)  # fast at first: fine, even past the grace
    pace.t0 -= 31
    pace(60 * 2**20, 100 * 2**20)
    pace.next_file()
    pace.t0 = time.monotonic() - 120  # then it trickles: 60 MiB in 120 s
    with pytest.raises(
        NodeprepError, match=r"60 MiB in 120 s \(0\.50 MiB/s, below the 2 MiB/s floor\)"
    ):
        pace(1, 100)


def test_a_connection_the_peer_closed_is_not_silence():
    """The peer's FIN (a node whose sshd was killed): end-of-file in CLOSE_WAIT, not the
    dead-peer rule's abort (TCP_CLOSE; tests/integration/test_silence.py makes that one)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    sock = _socket("127.0.0.1", server.getsockname()[1], 5, 15)
    peer, _ = server.accept()
    peer.close()
    assert sock.recv(10) == b""
    assert sock.aborted is False and sock.error is None
    sock.close()
    server.close()
