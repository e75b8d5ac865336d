"""A command on a node fed a stream on its stdin over one ssh channel, its output drained
meanwhile (so a chatty command cannot stall the stream on a full window): the wheel relay's
first hop (ops/pystack/relay_run.py) and a job's sync (ops/sync/push.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def feed(
    session,
    command: str,
    write: Callable,
    timeout: float | None = None,
    on_output: Callable[[bytes], None] | None = None,
) -> tuple[int, str]:
    """(exit status, output with stderr) of COMMAND on SESSION's node while WRITE(channel)
    sends its stdin (channel.sendall); stdin is closed after WRITE, whatever it raised.
    TIMEOUT: seconds any one send or receive may wait. ON_OUTPUT: called with each piece of
    output as it arrives (a stage's progress lines)."""
    session.connect()
    ch = session.conn.client.get_transport().open_session()
    got: list[bytes] = []
    try:
        if timeout is not None:
            ch.settimeout(timeout)
        ch.set_combine_stderr(True)
        ch.exec_command(command)

        def drain():
            try:
                while data := ch.recv(65536):
                    got.append(data)
                    if on_output is not None:
                        on_output(data)
            except OSError:
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        try:
            write(ch)
        finally:
            ch.shutdown_write()
        rc = ch.recv_exit_status()
        reader.join(30)
        return rc, b"".join(got).decode(errors="replace")
    finally:
        ch.close()
