"""The class of a failed run's root cause (ops/train/causes.py), from the rank watch fed as the
watchers feed it (test_rankwatch.py's ticks): what `train --restarts` retries and whom it
blames. The ranks' lines are the texts the real programs print: Python's traceback header,
the NVIDIA driver's Xid line (tests/recordings/xid/), torch's NCCL watchdog
(ProcessGroupNCCL.cpp), NCCL's "unhandled system error" (nccl.h.in), ssh's refusal as pdsh
relays it, torch's rendezvous refused (c10d's TCPStore)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from nodeprep.ops.train.causes import RETRIED, Cause, classify, node_of
from nodeprep.ops.train.rankwatch import RankWatch

from .test_rankwatch import end, spec, start

XID = Path(__file__).parents[1] / "recordings" / "xid" / "nvsentinel-155-comment-xid79-line.log"


def watch() -> RankWatch:
    return RankWatch(["worker-0", "worker-1"], ["worker-0"], spec().label_of, names=["worker-0"])


def line(rank: int, text: str, src: str = "err") -> dict:
    return {"k": "line", "src": f"r{rank}.{src}", "text": text}


def launcher_failed(text: str) -> RankWatch:
    """A watch whose launcher (on worker-0) said TEXT, then exited 1."""
    w = watch()
    ev = {"k": "line", "src": "L:0", "text": text}
    w.feed("worker-0", {"ev": [ev, {"k": "launcher", "label": "0", "rc": 1, "end": 120.0}]})
    return w


def cause(w: RankWatch) -> Cause | None:
    root = w.root_cause()
    tails = {k: list(v) for k, v in w.tails.items()}
    return classify(asdict(root) if root else None, tails, {"10.1.0.3": "worker-1"})


def test_a_traceback_is_the_users_error_not_retried_and_names_its_last_line():
    w = watch()
    w.feed("worker-1", {"ev": [start(2), start(3)]})
    w.feed(
        "worker-1",
        {
            "ev": [
                line(2, "Traceback (most recent call last):"),
                line(2, '  File "/job/main.py", line 41, in train'),
                line(2, "ValueError: epoch 1 went wrong"),
                end(2, 1, 110.0),
            ]
        },
    )
    c = cause(w)
    assert c.klass == "user" and c.node is None and not c.retried()
    assert c.why.endswith("ValueError: epoch 1 went wrong"), c
    assert c.retried(RETRIED | {"user"})  # --retry-on user


@pytest.mark.parametrize(
    "rc, oom, klass",
    [
        (2, None, "user"),
        (3, None, "user"),
        (-9, True, "killed"),
        (-9, None, "killed"),
        (137, None, "killed"),
        (-11, None, "killed"),
    ],
)
def test_an_exit_status_is_the_scripts_a_signal_is_not(rc, oom, klass):
    w = watch()
    w.feed("worker-1", {"ev": [start(2), end(2, rc, 110.0, oom=oom)]})
    c = cause(w)
    assert c.klass == klass and c.retried() == (klass == "killed"), c


def test_a_silent_node_is_blamed_and_retried():
    w = watch()
    w.feed("worker-0", {"ev": [start(0)]})
    w.lost("worker-1", "silent 8 s")
    c = cause(w)
    assert (c.klass, c.node) == ("node", "worker-1") and c.retried()


def test_a_hardware_sign_blames_its_node_even_when_a_peer_failed_first():
    """worker-0's rank lost its peer first; worker-1's rank printed the driver's Xid line and
    the NCCL watchdog: the hardware class, worker-1 blamed."""
    xid = XID.read_text().strip().splitlines()[0]
    w = watch()
    w.feed("worker-0", {"ev": [start(0), line(0, "Connection reset by peer"), end(0, 1, 110.0)]})
    w.feed(
        "worker-1",
        {
            "ev": [
                start(2),
                line(2, xid),
                line(
                    2,
                    "[rank2]:[E ProcessGroupNCCL.cpp:616] Watchdog "
                    "caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran "
                    "for 600000 milliseconds before timing out.",
                ),
                end(2, -6, 111.0),
            ]
        },
    )
    c = cause(w)
    assert (c.klass, c.node) == ("hardware", "worker-1") and c.retried(), c
    assert "Xid" in c.why


def test_a_launchers_ssh_failure_blames_the_node_it_names_else_the_launcher():
    w = launcher_failed("worker-1: ssh: connect to host 10.1.0.3 port 22: Connection refused")
    c = cause(w)
    assert c.klass == "node" and c.node == "worker-1" and c.retried(), c
    w = watch()
    w.feed("worker-0", {"ev": [{"k": "launcher", "label": "0", "rc": 2, "end": 120.0}]})
    assert cause(w).klass == "launcher" and not cause(w).retried()


def test_the_controllers_own_decisions():
    for kind, klass, retried in [
        ("hang", "hang", True),
        ("timeout", "timeout", False),
        ("interrupted", "interrupted", False),
        ("stopped", "interrupted", False),
    ]:
        w = watch()
        w.fail(kind, "why")
        c = cause(w)
        assert (c.klass, c.retried()) == (klass, retried)
    assert not Cause("interrupted", None, "").retried(frozenset({"interrupted"}))
    assert classify(None, {}) is None
    assert node_of("worker-1 r3") == "worker-1" and node_of("worker-1") == "worker-1"


def test_what_nccl_says_of_a_lost_peer_blames_no_node_and_a_traceback_stays_the_scripts():
    """worker-1's rank raised; worker-0's rank, its peer, then printed NCCL's system error and
    the watchdog: the victims' words. The script's error, no node blamed (no driver sign)."""
    w = watch()
    w.feed(
        "worker-1",
        {
            "ev": [
                start(2),
                line(2, "Traceback (most recent call last):"),
                line(2, "KeyError: 'labels'"),
                end(2, 1, 110.0),
            ]
        },
    )
    w.feed(
        "worker-0",
        {
            "ev": [
                start(0),
                line(
                    0,
                    "torch.distributed.DistBackendError: NCCL error in: "
                    "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO)",
                ),
                line(0, "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)"),
                end(0, -6, 111.0),
            ]
        },
    )
    c = cause(w)
    assert (c.klass, c.node) == ("user", None), c
    w = watch()
    w.feed(
        "worker-1", {"ev": [start(2), line(2, "nvidia-smi: ECC error count 0"), end(2, -9, 1.0)]}
    )
    assert cause(w).klass == "killed"  # an ordinary line about ECC is no sign


def test_torchs_rendezvous_refused_is_the_launchers_not_a_node_lost():
    w = launcher_failed(
        "torch.distributed.DistNetworkError: "
        "Failed to recv, got 0 bytes. Connection was likely closed. errno: 111 - "
        "Connection refused"
    )
    assert (cause(w).klass, cause(w).node) == ("launcher", None)
    w = launcher_failed("pdsh@worker-0: worker-1: ssh exited with exit code 255")
    assert (cause(w).klass, cause(w).node) == ("node", "worker-1")
