"""The part of one node in a bandwidth round (`invoke bandwidth`, commands/bandwidth.py runs it as
`python3 -I -S -c TEXT PORT PEER SECONDS`): it listens on PORT for the one node that sends to
it this round and, at the same time, sends to PEER (an address with the same PORT) for SECONDS,
so every node is busy both ways in every round. Before the bulk send it times 20 one-byte
round trips (the latency). It prints one JSON line: {"sent_bytes", "seconds", "rtt_ms",
"received_bytes", "error"}. PEER "-" only listens. Standard library only; no single quote in
this text (it travels as the argument of `python3 -c`), runs on any python3 from 3.6 on."""

import json
import socket
import sys
import threading
import time

CHUNK = 1 << 20
PINGS = 20


def serve(lsock, box, seconds):
    """Take one connection: answer its pings, then count what it sends until it closes."""
    lsock.settimeout(seconds + 30)
    try:
        conn, _addr = lsock.accept()
    except OSError as e:
        box["received_error"] = str(e)
        return
    conn.settimeout(seconds + 30)
    got = 0
    try:
        for _ in range(PINGS):
            if conn.recv(1) == b"":
                return
            conn.sendall(b"p")
        while True:
            data = conn.recv(CHUNK)
            if not data:
                break
            got += len(data)
    except OSError as e:
        box["received_error"] = str(e)
    finally:
        box["received_bytes"] = got
        conn.close()


def connect(peer, port, deadline):
    """The listener of the peer may start a moment after this one: retry until DEADLINE."""
    while True:
        try:
            return socket.create_connection((peer, port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def send(peer, port, seconds):
    s = connect(peer, port, time.monotonic() + 15)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        t0 = time.perf_counter()
        for _ in range(PINGS):
            s.sendall(b"p")
            if s.recv(1) == b"":
                raise OSError("the peer closed during the latency pings")
        rtt_ms = (time.perf_counter() - t0) / PINGS * 1000
        buf = b"\0" * CHUNK
        sent = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            s.sendall(buf)
            sent += CHUNK
        took = time.perf_counter() - t0
    finally:
        s.close()
    return sent, took, rtt_ms


def main():
    port = int(sys.argv[1])
    peer = sys.argv[2]
    seconds = float(sys.argv[3])
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("", port))
    lsock.listen(1)
    box = {}
    server = threading.Thread(target=serve, args=(lsock, box, seconds))
    server.start()
    out = {"sent_bytes": 0, "seconds": 0.0, "rtt_ms": None, "error": None}
    if peer != "-":
        try:
            out["sent_bytes"], out["seconds"], out["rtt_ms"] = send(peer, port, seconds)
        except OSError as e:
            out["error"] = "to %s:%d: %s" % (peer, port, e)
    server.join(seconds + 40)
    lsock.close()
    out["received_bytes"] = box.get("received_bytes", 0)
    out["received_error"] = box.get("received_error")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
