"""`invoke health` as text: one line per node (its worst verdict), then each finding that is
not OK with its fix, worst first; `--list-checks`: the catalogue with codes and sources."""
from __future__ import annotations

from nodeprep.ops.health.findings import Verdict


def findings(res) -> str:
    lines = []
    width = max((len(n) for n in res.nodes), default=4)
    for node in res.nodes:
        mine = sorted((f for f in res.findings if f.node == node and f.verdict is not Verdict.OK),
                      key=lambda f: -f.verdict)
        notes = [f for f in res.findings if f.node == node and f.verdict is Verdict.OK and f.code == "XID_APP"]
        lines.append(f"{node:<{width}}  {res.verdict(node).name}")
        for f in mine + notes:
            label = f.verdict.name if f.verdict is not Verdict.OK else "note"
            lines.append(f"  {label:<8} {f.code:<18} {f.reason}")
            if f.fix:
                lines.append(f"  {'':<8} {'':<18} fix: {f.fix}")
    for f in res.ignored:
        lines.append(f"ignored: {f.node} {f.verdict.name} {f.code} {f.reason}")
    bad = res.unhealthy()
    counts = {v: sum(1 for n in res.nodes if res.verdict(n) is v) for v in Verdict}
    summary = ", ".join(f"{counts[v]} {v.name}" for v in reversed(Verdict) if counts[v])
    lines.append(f"{len(res.nodes)} nodes: {summary}; {len(res.checks)} checks"
                 + (f"; unhealthy: {', '.join(bad)}" if bad else ""))
    return "\n".join(lines)


def catalogue(checks, command_codes: dict) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.name:<15} {c.about}" + (" [compares nodes]" if c.fleet else ""))
        for code, what in c.codes.items():
            lines.append(f"  {code:<20} {what}")
        if c.source:
            lines.append(f"  {'source:':<20} {c.source}")
    lines.append("the command itself:")
    lines += [f"  {code:<20} {what}" for code, what in command_codes.items()]
    return "\n".join(lines)
