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
error). A pair is listed as slow under SLOW of the median of all pairs."""
from __future__ import annotations

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
    return pairs, names[2 * half:]


def both_ways(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [d for a, b in pairs for d in ((a, b), (b, a))]


@dataclass
class Matrix:
    """Rates in Gbit/s and latencies in ms by (sender, receiver)."""
    names: list[str]
    rate: dict[tuple[str, str], float] = field(default_factory=dict)
    rtt: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)

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
                out[n] = (f"its fastest pair {b:.2f} Gbit/s, under {SLOW:g}x the median of every node's "
                          f"fastest pair ({ref:.2f} Gbit/s)")
        return out

    def suspects(self) -> set[str]:
        """Flagged nodes and nodes not measured yet (quick mode's second pass tests each
        against a known-good node)."""
        measured = {n for p in set(self.rate) | set(self.errors) for n in p}
        return set(self.flagged()) | (set(self.names) - measured)

    def as_dict(self) -> dict:
        key = lambda p: f"{p[0]}->{p[1]}"
        return {"nodes": self.names, "gbps": {key(p): round(v, 3) for p, v in sorted(self.rate.items())},
                "rtt_ms": {key(p): round(v, 3) for p, v in sorted(self.rtt.items())},
                "errors": {key(p): e for p, e in sorted(self.errors.items())},
                "median_gbps": self.median(), "slow": sorted(key(p) for p in self.slow_pairs()),
                "flagged": self.flagged(), "rule": RULE}


RULE = (f"a node is flagged when even its fastest pair is under {SLOW:g}x the median of every node's "
        "fastest pair (3 nodes or more)")


def second_pass(m: Matrix, suspects: set[str]) -> list[list[tuple[str, str]]]:
    """Rounds pairing each suspect with a known-good node (both ways), one good node per
    suspect per round."""
    good = [n for n in m.names if n not in suspects]
    if not good:
        return []
    todo = sorted(suspects)
    rounds = []
    while todo:
        now, todo = todo[:len(good)], todo[len(good):]
        rounds.append(both_ways(list(zip(now, good))))
    return rounds


def iperf3_result(text: str) -> dict:
    """The client's `iperf3 -J` document (nodeside/iperf3pair.sh) as the builtin sender's
    answer: {"sent_bytes", "seconds", "rtt_ms", "error"}. The bytes are what the receiver got
    (sum_received, iperf3's own receiver figure: what the sender wrote includes what still sat
    in its socket buffer when the time was up); rtt_ms: the kernel's smoothed RTT of the
    sending stream under load (iperf3's mean_rtt, Linux), not an idle ping."""
    body = text.split("\n@@end", 1)[0]
    doc = json_document(body)
    if doc is None:
        return {"sent_bytes": 0, "seconds": 0.0, "rtt_ms": None,
                "error": " ".join(body.split())[-200:] or "iperf3 printed nothing"}
    if doc.get("error"):
        return {"sent_bytes": 0, "seconds": 0.0, "rtt_ms": None, "error": f"iperf3: {doc['error']}"}
    end = doc.get("end") or {}
    sent = end.get("sum_received") or end.get("sum_sent") or {}
    streams = (doc.get("end") or {}).get("streams") or [{}]
    rtt = (streams[0].get("sender") or {}).get("mean_rtt")
    return {"sent_bytes": int(sent.get("bytes") or 0), "seconds": float(sent.get("seconds") or 0.0),
            "rtt_ms": rtt / 1000 if isinstance(rtt, (int, float)) else None, "error": None}
