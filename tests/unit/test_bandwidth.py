"""The pairwise bandwidth plan and rule (ops/health/pairs.py), and nodeside/bwpair.py run for
real between two local processes."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nodeprep import nodeside
from nodeprep.ops.health import pairs


def _names(n):
    return [f"w{i}" for i in range(n)]


def test_ring_shift_covers_every_ordered_pair_once_and_keeps_every_node_busy():
    for n in (2, 3, 4, 7, 32):
        rounds = pairs.ring_rounds(_names(n))
        assert len(rounds) == n - 1
        flows = [f for r in rounds for f in r]
        assert len(flows) == len(set(flows)) == n * (n - 1)
        for r in rounds:
            assert sorted(a for a, _ in r) == sorted(_names(n)) == sorted(b for _, b in r)   # one out, one in


def test_matching_is_disjoint_and_leaves_the_odd_node_out():
    got, left = pairs.matching(_names(5))
    assert got == [("w0", "w2"), ("w1", "w3")] and left == ["w4"]
    assert len({n for p in got for n in p}) == 4


def _matrix(n, slow_node=None, slow=0.1, fast=10.0, flows=None):
    m = pairs.Matrix(_names(n))
    for a, b in flows or [f for r in pairs.ring_rounds(_names(n)) for f in r]:
        m.rate[(a, b)] = slow if slow_node in (a, b) else fast
    return m


def test_the_node_common_to_the_slow_pairs_is_flagged():
    m = _matrix(6, "w3")
    assert list(m.flagged()) == ["w3"] and "its fastest pair 0.10 Gbit/s" in m.flagged()["w3"]
    assert _matrix(6).flagged() == {}
    every = _matrix(4, None, fast=1.0)
    every.rate[("w0", "w1")] = 0.9
    assert every.flagged() == {}                    # noise is no finding
    m = _matrix(4, "w1")
    m.errors[("w2", "w0")] = "refused"
    assert list(m.flagged()) == ["w1"]


def test_three_nodes_one_slow_as_measured_on_the_lab():
    m = pairs.Matrix(_names(3))
    m.rate.update({("w0", "w1"): 16.90, ("w0", "w2"): 0.05, ("w1", "w0"): 16.72, ("w1", "w2"): 0.04,
                   ("w2", "w0"): 0.06, ("w2", "w1"): 0.05})      # 2026-11-25, worker-2 at 50mbit
    assert list(m.flagged()) == ["w2"]


def test_two_slow_nodes_of_four_and_the_limits_of_two():
    m = _matrix(4, "w2")
    for p in list(m.rate):
        if "w3" in p:
            m.rate[p] = 0.1
    assert sorted(m.flagged()) == ["w2", "w3"]
    assert _matrix(2, "w1").flagged() == {}                      # two nodes: nothing to compare
    m = _matrix(4)
    for p in [p for p in m.rate if "w3" in p]:
        del m.rate[p]
        m.errors[p] = "refused"
    assert list(m.flagged()) == ["w3"] and "none of its" in m.flagged()["w3"]


def test_quick_second_pass_pairs_each_suspect_with_a_good_node():
    matched, _ = pairs.matching(_names(6))
    m = _matrix(6, "w4", flows=pairs.both_ways(matched))
    assert m.suspects() == {"w1", "w4"}                          # a slow pair: either end
    rounds = pairs.second_pass(m, m.suspects())
    assert rounds == [[("w1", "w0"), ("w0", "w1"), ("w4", "w2"), ("w2", "w4")]]
    for a, b in rounds[0]:
        m.rate[(a, b)] = 0.1 if "w4" in (a, b) else 10.0
    assert {n for n in m.flagged() if n in m.suspects()} == {"w4"}


def test_bwpair_program_sends_to_a_listener_for_real():
    """One process listening on PORT and sending to 127.0.0.1:PORT: its own listener is the
    peer, so what it received must be what it sent (the round's both halves, on loopback)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    text = nodeside.BWPAIR.read_text()
    assert "'" not in text                                 # it travels as python3 -c '...'
    r = subprocess.run([sys.executable, "-I", "-S", "-c", text, str(port), "127.0.0.1", "0.3"],
                       capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["error"] is None and out["received_error"] is None, r.stderr
    assert out["sent_bytes"] > 0 and out["received_bytes"] == out["sent_bytes"]
    assert out["rtt_ms"] is not None and out["seconds"] >= 0.3


REC = Path(__file__).resolve().parents[1] / "recordings" / "iperf3"


def test_iperf3_client_json_read_as_the_builtin_answer():
    got = pairs.iperf3_result((REC / "client-1s-lab-veth.json").read_text() + "@@end\n")
    assert got == {"sent_bytes": 1863319552, "seconds": 1.002052, "rtt_ms": 0.053, "error": None}   # received
    refused = pairs.iperf3_result((REC / "client-refused.json").read_text())
    assert refused["error"] == "iperf3: unable to connect to server: Connection refused" and not refused["seconds"]
    assert pairs.iperf3_result("sh: 1: iperf3: not found\n@@end\n")["error"] == "sh: 1: iperf3: not found"
    assert pairs.iperf3_result("")["error"] == "iperf3 printed nothing"


class _Fleet:
    """Stands in for Fleet.map over nodes that have iperf3 (HAS) or not."""
    def __init__(self, has: dict):
        self.has = has

    def map(self, fn, stage):
        return dict(self.has)


def test_the_tool_is_iperf3_only_where_every_node_has_it():
    from nodeprep.commands.bandwidth import choose_tool
    from nodeprep.errors import InputError
    assert choose_tool(_Fleet({"a": True, "b": True}), "auto") == "iperf3"
    assert choose_tool(_Fleet({"a": True, "b": False}), "auto") == "builtin"
    assert choose_tool(_Fleet({"a": True, "b": True}), "builtin") == "builtin"
    with pytest.raises(InputError, match="no iperf3 on b"):
        choose_tool(_Fleet({"a": True, "b": False}), "iperf3")


def test_iperf3pair_runs_for_real_against_itself():
    """nodeside/iperf3pair.sh with its own address as the peer: its server takes its client."""
    import shutil
    if shutil.which("iperf3") is None:
        pytest.skip("iperf3 missing: requirements/bootstrap.sh installs it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(["sh", "-c", nodeside.IPERF3PAIR.read_text(), "-", str(port), "127.0.0.1", "1", "30"],
                       capture_output=True, text=True, timeout=60)
    got = pairs.iperf3_result(r.stdout)
    assert r.returncode == 0 and got["error"] is None and got["sent_bytes"] > 0 and 0.9 < got["seconds"] < 2, r.stdout[-500:]
