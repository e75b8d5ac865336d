"""`invoke doctor` as text, flutter-doctor style: one line per check ([✓] OK, [!] WARN, [?]
UNKNOWN, [✗] CRITICAL) with what it saw, each finding under it with its fix (nodes with the
same finding folded into one node set), then one summary line. -v: every subject's line."""

from __future__ import annotations

from nodeprep.inventory.nodeset import fold
from nodeprep.ops.health.findings import Verdict

MARK = {Verdict.OK: "[✓]", Verdict.WARN: "[!]", Verdict.UNKNOWN: "[?]", Verdict.CRITICAL: "[✗]"}


def _grouped(findings) -> list[tuple[list[str], object]]:
    """Findings alike but for their node (the node's name replaced) as (nodes, one of them)."""
    groups: dict = {}
    for f in findings:
        key = (f.code, f.verdict, f.reason.replace(f.node, "\0"), f.fix.replace(f.node, "\0"))
        groups.setdefault(key, []).append(f)
    return [([f.node for f in fs], fs[0]) for fs in groups.values()]


def _summary(mine, verdict) -> str:
    if len({f.node for f in mine}) == 1 and len(mine) == 1 and verdict is Verdict.OK:
        return mine[0].reason
    if mine[0].node == "controller":
        return f"{sum(f.verdict is not Verdict.OK for f in mine)} finding(s)"
    ok = sorted({f.node for f in mine} - {f.node for f in mine if f.verdict is not Verdict.OK})
    return f"{len(ok)} of {len({f.node for f in mine})} OK" + (
        f" ({fold(ok)})" if ok and verdict is not Verdict.OK else ""
    )


def render(res, verbose: bool = False) -> str:
    lines = []
    head = "controller"
    for check in res.checks:
        mine = [f for f in res.findings if f.check == check]
        if not mine:
            continue
        area = (
            "controller"
            if mine[0].node == "controller"
            else f"nodes ({res.inventory}, {len(res.nodes)})"
        )
        if area != head or not lines:
            lines.append(area)
            head = area
        v = res.verdict(check)
        lines.append(f"  {MARK[v]} {check:<12} {_summary(mine, v)}")
        shown = mine if verbose else [f for f in mine if f.verdict is not Verdict.OK]
        for nodes, f in _grouped(sorted(shown, key=lambda f: -f.verdict)):
            who = "" if f.node == "controller" else f"{fold(nodes)}: "
            lines.append(f"      {f.verdict.name:<8} {f.code}: {who}{f.reason}")
            if f.fix:
                lines.append(
                    f"      {'':<8} fix: {f.fix}"
                    + (f"  (for each of {fold(nodes)})" if len(nodes) > 1 else "")
                )
    if res.skipped:
        lines.append(res.skipped)
    bad = res.problems()
    counts = {v: sum(1 for f in bad if f.verdict is v) for v in Verdict if v is not Verdict.OK}
    lines.append(
        f"doctor: {len(res.checks)} checks, "
        + (
            ", ".join(f"{n} {v.name}" for v, n in sorted(counts.items(), reverse=True) if n)
            + " finding(s): follow the fixes, then rerun `invoke doctor`"
            if bad
            else "no issue found"
        )
    )
    return "\n".join(lines)


def catalogue(checks, common: dict) -> str:
    lines = []
    for c in checks:
        lines.append(f"{c.name:<12} [{c.tier}] {c.about}")
        lines += [f"  {code:<18} {what}" for code, what in c.codes.items()]
    lines.append("any check:")
    lines += [f"  {code:<18} {what}" for code, what in common.items()]
    return "\n".join(lines)
