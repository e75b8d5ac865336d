"""A parity report (ops/verify/parity.py) as text, the way clubak shows grouped output: each
differing key, then one line per group of nodes that share a value (`  worker-[0-1]  1.26.4`),
failed checks, unreachable nodes, and always one verdict line."""

from __future__ import annotations

import json

from nodeprep.inventory.nodeset import fold
from nodeprep.ops.verify.parity import SEVERITIES, Report, canon

_MAX_LINE = 120  # longer values are cut: a parity report is read, not diffed
_MAX_LINES = 12  # lines of a multi-line value shown before "…"
_MAX_NODE_COL = 32  # a very long folded set should not push every value off screen
_COLORS = {"error": "31", "warning": "33", "info": "36", "ok": "32"}


def _show(value, quote: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        # "" and "-" would look like absent; quoting also exposes whitespace-only differences.
        return json.dumps(value, ensure_ascii=False) if quote or value in ("", "-") else value
    return canon(value)


def _value_lines(text: str) -> list[str]:
    lines = text.split("\n")
    if len(lines) > _MAX_LINES:
        lines = lines[:_MAX_LINES] + ["…"]
    return [ln if len(ln) <= _MAX_LINE else ln[: _MAX_LINE - 1] + "…" for ln in lines]


def _paint(text: str, tone: str, color: bool) -> str:
    return f"\033[{_COLORS[tone]}m{text}\033[0m" if color else text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _names(keys: list[str], limit: int = 4) -> str:
    more = f", +{len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def render(report: Report, color: bool = False) -> str:
    """The clubak-style text: differing keys, failed checks, unreachable nodes, verdict."""
    rows = [fold(g.nodes) for d in report.drift for g in d.groups]
    check_rows = _fold_rows(report.checks, lambda c: (c["key"], c["message"], c["severity"]))
    reasons = _fold_rows(
        [{"node": n, "reason": r} for n, r in report.unreachable.items()], lambda u: (u["reason"],)
    )
    rows += [nodes for nodes, _ in check_rows + reasons]
    width = min(max(map(len, rows), default=0), _MAX_NODE_COL)
    label_width = max((len(g.label) for d in report.drift for g in d.groups if g.label), default=0)
    out = []
    for d in report.drift:
        tag = "" if d.severity == "error" else f"  ({d.severity})"
        out.append(_paint(d.key, d.severity, color) + tag)
        shown = [_show(g.value) for g in d.groups]
        # Values that print alike, or differ only in edge whitespace, are shown quoted.
        quote = len(set(shown)) < len(shown) or any(t != t.strip() for t in shown)
        for i, g in enumerate(d.groups):
            lead = f"  {fold(g.nodes):<{width}}  "
            if g.label:
                lead += f"{g.label:<{label_width}}  "
            lines = _value_lines(_show(g.value, quote))
            first = lead + lines[0]
            out.append(_paint(first, d.severity, color) if i and not g.label else first)
            out.extend(" " * len(lead) + ln for ln in lines[1:])
    if report.per_platform:
        out.append("expected per platform (each platform the same within):")
        for d in report.per_platform:
            out.append(
                f"  {d.key}: " + "; ".join(f"{fold(g.nodes)} {_show(g.value)}" for g in d.groups)
            )
    for nodes, (key, message, level) in check_rows:
        tag = "" if level == "error" else f"  ({level})"
        out.append(f"{nodes:<{width}}  {key + ': ' if key else ''}{message}{tag}")
    for nodes, (reason,) in reasons:
        out.append(f"{nodes:<{width}}  unreachable: {reason}")
    out.append(_paint(verdict(report), "ok" if report.ok else "error", color))
    return "\n".join(out) + "\n"


def _fold_rows(items: list[dict], key_of) -> list[tuple[str, tuple]]:
    # Identical messages from several nodes become one line, as clubak would print them.
    rows: dict[tuple, list[str]] = {}
    for item in items:
        rows.setdefault(key_of(item), []).append(item["node"])
    return [(fold(nodes), key) for key, nodes in rows.items()]


def verdict(report: Report) -> str:
    """One line that always says whether the fleet passed and, if not, where it differs."""
    # Nodes added to or removed from a baseline were not compared: they are counted as checks.
    skip = {c["node"] for c in report.checks if c["key"] == "baseline"} if report.baseline else ()
    reachable = [n for n in report.nodes if n not in report.unreachable and n not in skip]
    by_level = {
        s: list(dict.fromkeys(d.key for d in report.drift if d.severity == s)) for s in SEVERITIES
    }
    same = "unchanged since the baseline" if report.baseline else "identical"
    differ = "changed since the baseline" if report.baseline else "differ"
    head = "PARITY OK" if report.ok else "PARITY FAILED"
    if not reachable:
        line = f"{head}: no node could be compared"
    elif by_level["error"]:
        errors = by_level["error"]
        odd = set(n for d in report.drift if d.severity == "error" for n in d.odd_nodes())
        odd_nodes = [n for n in reachable if n in odd]
        verb = differ if report.baseline or len(errors) > 1 else "differs"
        line = (
            f"DRIFT: {_plural(len(errors), 'key')} {verb} on {len(odd_nodes)} of "
            f"{_plural(len(reachable), 'node')} ({_names(errors)})"
        )
        folded = fold(odd_nodes)
        if (report.baseline or 2 * len(odd_nodes) < len(reachable)) and len(folded) <= 60:
            line += f", odd {'node' if len(odd_nodes) == 1 else 'nodes'}: {folded}"
    else:
        drifted = len({d.key for d in report.drift} | {d.key for d in report.per_platform})
        on = (
            f"{report.compared_keys - drifted} of {report.compared_keys} keys"
            if drifted
            else _plural(report.compared_keys, "key")
        )
        line = f"{head}: {_plural(len(reachable), 'node')} {same} on {on}"
    tails = []
    if by_level["warning"]:
        tails.append(
            f"{_plural(len(by_level['warning']), 'warning')} ({_names(by_level['warning'])})"
        )
    if by_level["info"]:
        tails.append(f"{len(by_level['info'])} info ({_names(by_level['info'])})")
    failed = sum(c["severity"] == "error" for c in report.checks)
    if report.per_platform:
        tails.append(
            f"{_plural(len(report.per_platform), 'key')} differ per platform as expected "
            f"({_names([d.key for d in report.per_platform])})"
        )
    if failed:
        tails.append(f"{_plural(failed, 'check')} failed")
    if len(report.checks) > failed:  # warning/info checks: listed, never failing
        tails.append(_plural(len(report.checks) - failed, "check note"))
    if report.unreachable:
        tails.append(
            f"{_plural(len(report.unreachable), 'node')} unreachable ({fold(report.unreachable)})"
        )
    return "; ".join([line] + tails)
