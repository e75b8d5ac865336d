"""Pairwise bandwidth: which nodes send to which in each round, and which node is slow.

Full (IBM Autopilot's ring shift): N-1 rounds; in round r node i sends to node i+r (mod N) and
receives from node i-r, so every node is busy both ways in every round and after N-1 rounds
every ordered pair was measured once. Quick (Google cluster-health-scanner's perfect matching):
one round of disjoint pairs, both directions at once (an odd node out joins the second pass);
then every suspect against a known-good node; a node that passed never flips to fail.

The rule (stated in the output): a pair runs at the pace of its slower end, so a node's own
capacity shows in its FASTEST pair; a node is flagged when even its fastest pair is under SLOW
(half) of the median of every node's fastest pair (the node common to the slow pairs, nccl-tests
106's reasoning), or when none of its flows completed while others did. It needs 3 nodes
measured: with 2 there is nothing to compare (no node is flagged; a failed flow still is an
error). A pair is listed as slow under SLOW of the median of all pairs.

iperf3 on one node can fail for a reason of its own (a full /tmp: it mmaps its buffer from a
file there; a crash; not installed) and take its peers' flows with it. record_iperf3 tells
that from a network failure by each node's words (own_failure: iperf3's error line, not the
connection's), names the node (Matrix.unmeasured, tool_errors), and the command measures the
matrix again with the builtin program (Fallback: the rule compares the rates of one tool)."""

from __future__ import annotations

import signal
import statistics
from dataclasses import dataclass, field

from nodeprep.engine.facts.probe import json_document

SLOW = 0.5


def ring_rounds(names: list[str]) -> list[list[tuple[str, str]]]:
    n = len(names)
    return [[(names[i], names[(i + r) % n]) for i in range(n)] for r in range(1, n)]


def matching(names: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(disjoint pairs: node i with node i + N/2, the node left over when N is odd)."""
    half = len(names) // 2
    pairs = [(names[i], names[i + half]) for i in range(half)]
    return pairs, names[2 * half :]


def both_ways(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [d for a, b in pairs for d in ((a, b), (b, a))]


@dataclass
class Matrix:
    """Rates in Gbit/s and latencies in ms by (sender, receiver)."""

    names: list[str]
    rate: dict[tuple[str, str], float] = field(default_factory=dict)
    rtt: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    # iperf3 rounds: flows iperf3 failed for a node's own reason -> that node; node -> its line
    unmeasured: dict[tuple[str, str], str] = field(default_factory=dict)
    tool_errors: dict[str, str] = field(default_factory=dict)

    def median(self) -> float | None:
        vals = list(self.rate.values())
        return statistics.median(vals) if vals else None

    def slow_pairs(self) -> set[tuple[str, str]]:
        med = self.median()
        return {p for p, v in self.rate.items() if med and v < SLOW * med} | set(self.errors)

    def best(self, node: str) -> float | None:
        rates = [v for p, v in self.rate.items() if node in p]
        return max(rates) if rates else None

    def flagged(self) -> dict[str, str]:
        """{node: why} for the nodes whose fastest pair is slow against the fleet's."""
        bests = {n: self.best(n) for n in self.names}
        known = [b for b in bests.values() if b is not None]
        if len(known) < 3:
            return {}
        ref = statistics.median(known)
        out = {}
        for n, b in bests.items():
            tried = [p for p in set(self.rate) | set(self.errors) if n in p]
            if b is None and tried:
                out[n] = f"none of its {len(tried)} flow(s) completed"
            elif b is not None and b < SLOW * ref:
                out[n] = (
                    f"its fastest pair {b:.2f} Gbit/s, under {SLOW:g}x the median of every node's "
                    f"fastest pair ({ref:.2f} Gbit/s)"
                )
        return out

    def suspects(self) -> set[str]:
        """Flagged nodes and nodes not measured yet (quick mode's second pass tests each
        against a known-good node)."""
        measured = {n for p in set(self.rate) | set(self.errors) for n in p}
        return set(self.flagged()) | (set(self.names) - measured)

    def as_dict(self) -> dict:
        key = lambda p: f"{p[0]}->{p[1]}"
        return {
            "nodes": self.names,
            "gbps": {key(p): round(v, 3) for p, v in sorted(self.rate.items())},
            "rtt_ms": {key(p): round(v, 3) for p, v in sorted(self.rtt.items())},
            "errors": {key(p): e for p, e in sorted(self.errors.items())},
            "median_gbps": self.median(),
            "slow": sorted(key(p) for p in self.slow_pairs()),
            "flagged": self.flagged(),
            "rule": RULE,
        }


RULE = (
    f"a node is flagged when even its fastest pair is under {SLOW:g}x the median of every node's "
    "fastest pair (3 nodes or more)"
)


def second_pass(m: Matrix, suspects: set[str]) -> list[list[tuple[str, str]]]:
    """Rounds pairing each suspect with a known-good node (both ways), one good node per
    suspect per round."""
    good = [n for n in m.names if n not in suspects]
    if not good:
        return []
    todo = sorted(suspects)
    rounds = []
    while todo:
        now, todo = todo[: len(good)], todo[len(good) :]
        rounds.append(both_ways(list(zip(now, good))))
    return rounds


def _split(text: str) -> tuple[str, dict[str, int | None], str]:
    """nodeside/iperf3pair.sh's output: (the client's text, {"client": rc, "server": rc}, the
    server's words)."""
    parts: dict[str, list[str]] = {"": []}
    rcs: dict[str, int | None] = {}
    now = ""
    for line in text.splitlines():
        if line.startswith("@@"):
            now, _, rc = line[2:].strip().partition(" ")
            if now == "end":
                break
            rcs[now] = int(rc) if rc.strip().lstrip("-").isdigit() else None
            parts[now] = []
        else:
            parts.setdefault(now, []).append(line)
    return "\n".join(parts[""]), rcs, "\n".join(parts.get("server", []))


def iperf3_result(text: str) -> dict:
    """The client's `iperf3 -J` document (nodeside/iperf3pair.sh) as the builtin sender's
    answer: {"sent_bytes", "seconds", "rtt_ms", "error"}. The bytes are what the receiver got
    (sum_received, iperf3's own receiver figure: what the sender wrote includes what still sat
    in its socket buffer when the time was up); rtt_ms: the kernel's smoothed RTT of the
    sending stream under load (iperf3's mean_rtt, Linux), not an idle ping."""
    body = _split(text)[0]
    doc = json_document(body)
    if doc is None:
        return {
            "sent_bytes": 0,
            "seconds": 0.0,
            "rtt_ms": None,
            "error": " ".join(body.split())[-200:] or NOTHING,
        }
    if doc.get("error"):
        return {"sent_bytes": 0, "seconds": 0.0, "rtt_ms": None, "error": f"iperf3: {doc['error']}"}
    end = doc.get("end") or {}
    sent = end.get("sum_received") or end.get("sum_sent") or {}
    streams = (doc.get("end") or {}).get("streams") or [{}]
    rtt = (streams[0].get("sender") or {}).get("mean_rtt")
    return {
        "sent_bytes": int(sent.get("bytes") or 0),
        "seconds": float(sent.get("seconds") or 0.0),
        "rtt_ms": rtt / 1000 if isinstance(rtt, (int, float)) else None,
        "error": None,
    }


NOTHING = "iperf3 printed nothing"
# iperf3's words (iperf_error.c) and the kernel's for a connection that could not be made or
# was cut: the network's doing, or the peer's iperf3 dying mid-test (a healthy node's client
# then says "control socket has closed unexpectedly"), never this node's own iperf3.
CONNECTION = (
    "unable to connect",
    "control socket has closed",
    "unexpectedly closed the connection",
    "has terminated",
    "unable to receive control message",
    "unable to send control message",
    "unable to receive results",
    "unable to send results",
    "unable to accept stream",
    "connection reset",
    "broken pipe",
    "no route to host",
    "network is unreachable",
    "timed out",
    "connection refused",
    "server is busy",
    "address already in use",
)


def own_failure(error: str | None, rc: int | None) -> str | None:
    """Why iperf3 itself failed on this node, from its error line and exit status: the line
    (a full /tmp: "iperf3: error - failed to read /dev/urandom: Bad address"), a crash (killed by
    a signal), not installed; None when it did not fail, or when what failed is the connection
    (CONNECTION) or the time (timeout's 124: the peer never came, or a hang)."""
    line = "" if error in (None, NOTHING) else " ".join(error.split())
    if any(w in line.lower() for w in CONNECTION) or rc == 124:
        return None
    if rc is not None and rc > 128:
        try:
            name = signal.Signals(rc - 128).name
        except ValueError:
            name = f"signal {rc - 128}"
        return f"iperf3 killed by {name} (exit {rc})" + (f": {line}" if line else "")
    if line:
        return line
    return f"iperf3 exited {rc} and printed nothing" if rc else None


def iperf3_answer(text: str) -> dict:
    """One node's iperf3pair.sh output: its client's result (iperf3_result) and what failed of
    its own iperf3 as a client and as a server (own_failure, None when nothing did)."""
    _body, rcs, server = _split(text)
    client = iperf3_result(text)
    lines = [ln.strip() for ln in server.splitlines() if ln.strip()]
    return {
        "client": client,
        "client_failure": own_failure(client["error"], rcs.get("client")),
        "server_failure": own_failure(lines[-1] if lines else None, rcs.get("server")),
    }


def record_iperf3(m: Matrix, flows: list[tuple[str, str]], answers: dict[str, dict]) -> None:
    """One iperf3 round into M (ANSWERS: iperf3_answer by node; a node missing did not
    answer). A flow that failed is laid on its sender's own iperf3 when that failed, else on
    its receiver's iperf3 server (Matrix.unmeasured, with the node's line in tool_errors), else
    it is an error as a network failure is."""
    for src, dst in flows:
        a = answers.get(src)
        if a is None:
            m.errors[(src, dst)] = "the sender did not answer"
            continue
        res = a["client"]
        if not res["error"] and res["seconds"]:
            record(m, (src, dst), res)
            continue
        blame = [(src, a["client_failure"]), (dst, (answers.get(dst) or {}).get("server_failure"))]
        node, why = next(((n, w) for n, w in blame if w), (None, None))
        if node is None:
            m.errors[(src, dst)] = res["error"] or "nothing sent"
        else:
            m.unmeasured[(src, dst)] = node
            m.tool_errors.setdefault(node, why)


def record(m: Matrix, flow: tuple[str, str], res: dict) -> None:
    m.rate[flow] = res["sent_bytes"] * 8 / res["seconds"] / 1e9
    if res.get("rtt_ms") is not None:
        m.rtt[flow] = res["rtt_ms"]


@dataclass
class Fallback:
    """Why the builtin program measured the matrix: NODES whose iperf3 failed for its own
    reason (node -> iperf3's line, or not on the PATH), the PAIRS it left unmeasured (pair ->
    that node), what it did measure in the ROUNDS given up (GBPS: reported, not judged: the
    rule compares rates, and the two tools' differ on the same link: iperf3 14.5 Gbit/s and the
    builtin program 2.3-4.6 between the same lab nodes, tests/unit/test_bandwidth.py)."""

    nodes: dict[str, str]
    pairs: dict[tuple[str, str], str] = field(default_factory=dict)
    gbps: dict[tuple[str, str], float] = field(default_factory=dict)
    rounds: int = 0

    @classmethod
    def of(cls, m: Matrix, rounds: int) -> Fallback:
        named = sorted(set(m.unmeasured.values()))
        return cls({n: m.tool_errors[n] for n in named}, dict(m.unmeasured), dict(m.rate), rounds)

    def as_dict(self) -> dict:
        key = lambda p: f"{p[0]}->{p[1]}"
        return {
            "from": "iperf3",
            "to": "builtin",
            "nodes": self.nodes,
            "not_measured_with_iperf3": {key(p): n for p, n in sorted(self.pairs.items())},
            "iperf3_gbps": {key(p): round(v, 3) for p, v in sorted(self.gbps.items())},
            "iperf3_rounds": self.rounds,
            "why": FALLBACK,
        }


FALLBACK = (
    "iperf3 failed on a node for a reason of its own: "
    "every pair measured with the builtin program, "
    "since the rule compares the rates of one tool"
)
