"""`invoke health` as text: one line per node (its worst verdict), then each finding that is
not OK with its fix, worst first; `--list-checks`: the catalogue with codes and sources."""

from __future__ import annotations

from nodeprep.ops.health.findings import Verdict


def findings(res) -> str:
    lines = []
    width = max((len(n) for n in res.nodes), default=4)
    for node in res.nodes:
        mine = sorted(
            (f for f in res.findings if f.node == node and f.verdict is not Verdict.OK),
            key=lambda f: -f.verdict,
        )
        notes = [
            f
            for f in res.findings
            if f.node == node and f.verdict is Verdict.OK and f.code == "XID_APP"
        ]
        lines.append(f"{node:<{width}}  {res.verdict(node).name}")
        for f in mine + notes:
            label = f.verdict.name if f.verdict is not Verdict.OK else "note"
            lines.append(f"  {label:<8} {f.code:<18} {f.reason}")
            if f.fix:
                lines.append(f"  {'':<8} {'':<18} fix: {f.fix}")
    for f in res.ignored:
        lines.append(f"ignored: {f.node} {f.verdict.name} {f.code} {f.reason}")
    for a, err in res.slurm:
        what = {
            "drain": f"drained ({a.reason})",
            "resume": "returned to service",
            "keep": "unchanged",
        }[a.op]
        lines.append(
            f"slurm: {a.node}{'' if a.slurm in ('', a.node) else f' ({a.slurm})'}: "
            + (f"{a.op} FAILED: {err}" if err else f"{what}: {a.why}")
        )
    bad = res.unhealthy()
    counts = {v: sum(1 for n in res.nodes if res.verdict(n) is v) for v in Verdict}
    summary = ", ".join(f"{counts[v]} {v.name}" for v in reversed(Verdict) if counts[v])
    lines.append(
        f"{len(res.nodes)} nodes: {summary}; {len(res.checks)} checks"
        + (f"; unhealthy: {', '.join(bad)}" if bad else "")
    )
    return "\n".join(lines)


def catalogue(checks, command_codes: dict) -> str:
    lines = []
    for c in checks:
        lines.append(
            f"{c.name:<15} {c.about}"
            + (" [compares nodes]" if c.fleet else "")
            + (" [--deep]" if c.tier == "deep" else "")
        )
        for code, what in c.codes.items():
            lines.append(f"  {code:<20} {what}")
        if c.source:
            lines.append(f"  {'source:':<20} {c.source}")
    lines.append("the command itself:")
    lines += [f"  {code:<20} {what}" for code, what in command_codes.items()]
    return "\n".join(lines)


def bandwidth(res, width: int = 12) -> str:
    """The N x N matrix (Gbit/s, sender rows, receiver columns) up to WIDTH nodes, else the
    slowest pairs ranked; then the flagged nodes and the rule."""
    m = res.matrix
    secs = max(1, round(res.seconds)) if res.tool == "iperf3" else res.seconds
    lines = [
        f"bandwidth ({res.mode}, {res.tool}: {res.rounds} round(s) of {secs:g} s, "
        "every node sending and "
        f"receiving at once), Gbit/s"
    ]
    if len(m.names) <= width:
        w = max(8, max(len(n) for n in m.names) + 1)
        lines.append(" " * w + "".join(f"{n:>{w}}" for n in m.names))
        for a in m.names:
            cells = [
                "-"
                if a == b
                else f"{m.rate[(a, b)]:.2f}"
                if (a, b) in m.rate
                else "fail"
                if (a, b) in m.errors
                else ""
                for b in m.names
            ]
            lines.append(f"{a:<{w}}" + "".join(f"{c:>{w}}" for c in cells))
    else:
        ranked = sorted(m.rate.items(), key=lambda kv: kv[1])[:20]
        lines.append("slowest pairs:")
        lines += [
            f"  {a} -> {b}  {v:.2f} Gbit/s  rtt {m.rtt.get((a, b), float('nan')):.2f} ms"
            for (a, b), v in ranked
        ]
    for (a, b), err in sorted(m.errors.items()):
        lines.append(f"failed: {a} -> {b}: {err}")
    lines += _fallback(res.fallback)
    med = m.median()
    lines.append(
        f"median {med:.2f} Gbit/s over {len(m.rate)} pair(s); rule: {m.as_dict()['rule']}"
        if med
        else "no pair completed"
    )
    for n, why in res.flagged.items():
        lines.append(f"SLOW {n}: {why}")
    if not res.flagged and not m.errors:
        lines.append("no node flagged")
    return "\n".join(lines)


def _fallback(fb) -> list[str]:
    """The nodes iperf3 could not measure and why, and what the builtin program measured."""
    if fb is None:
        return []
    lines = [f"not measured with iperf3: {n}: {why}" for n, why in fb.nodes.items()]
    if fb.pairs:
        lines.append(
            f"  iperf3 failed {len(fb.pairs)} pair(s) in {fb.rounds} round(s): "
            + ", ".join(f"{a} -> {b}" for a, b in sorted(fb.pairs))
        )
    lines.append(
        "  every pair measured with the builtin program (the rule compares the rates of one tool)"
    )
    return lines


def heatmap_png(res, path: str) -> None:
    """The matrix as a heatmap PNG (matplotlib, imported only here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = res.matrix
    n = len(m.names)
    grid = [[m.rate.get((a, b), float("nan")) for b in m.names] for a in m.names]
    fig, ax = plt.subplots(figsize=(max(4, n * 0.5 + 2), max(3.5, n * 0.5 + 1.5)))
    im = ax.imshow(grid, cmap="viridis")
    ax.set_xticks(range(n), m.names, rotation=90, fontsize=7)
    ax.set_yticks(range(n), m.names, fontsize=7)
    ax.set_xlabel("receiver")
    ax.set_ylabel("sender")
    ax.set_title(f"TCP Gbit/s ({res.mode})")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
