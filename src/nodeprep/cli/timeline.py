"""A training job's timeline as a PNG (`train --png`, `train.status --png`): one row per node
that took part, one bar per attempt on each of its nodes from the attempt's start to its end
(green: the attempt finished, red: it failed, grey: still running), an X on the node a failure
blamed with the failure's class, and a node's quarantine marked where it began. matplotlib is
imported only here, as for the bandwidth heatmap (health_text.heatmap_png)."""

from __future__ import annotations

import time

COLOURS = {"finished": "#2e7d32", "failed": "#c62828", "running": "#9e9e9e"}


def rows(attempts: list[dict]) -> list[str]:
    """The nodes in the order they first took part (spares last, as they joined)."""
    out: list[str] = []
    for a in attempts:
        for n in [*a["nodes"], *a.get("quarantined", {})]:
            if n not in out:
                out.append(n)
    return out


def bars(attempts: list[dict], now: float | None = None) -> list[tuple]:
    """(node, start s, length s, outcome, attempt) per attempt and node, seconds from the
    job's start; an attempt without an end runs until NOW."""
    t0 = attempts[0]["started"]
    out = []
    for a in attempts:
        end = a.get("ended") or (now or time.time())
        state = "running" if not a.get("ended") else ("failed" if a.get("cause") else "finished")
        for n in a["nodes"]:
            out.append((n, a["started"] - t0, max(end - a["started"], 0.1), state, a["attempt"]))
    return out


def png(attempts: list[dict], path: str, title: str) -> None:
    """ATTEMPTS (rundir.attempts' records, each with started/ended) drawn to PATH."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = rows(attempts)
    y = {n: i for i, n in enumerate(names)}
    t0 = attempts[0]["started"]
    last = max(s + n for _node, s, n, _st, _k in bars(attempts))
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(names)))
    for node, start, length, state, k in bars(attempts):
        ax.broken_barh([(start, length)], (y[node] - 0.35, 0.7), color=COLOURS[state])
        ax.text(start + length / 2, y[node], str(k), ha="center", va="center", color="white")
    for a in attempts:
        cause = a.get("cause") or {}
        if cause.get("node") in y and a.get("ended"):
            x = a["ended"] - t0
            ax.plot([x], [y[cause["node"]]], marker="x", color="black", markersize=12)
            ax.annotate(cause["klass"], (x, y[cause["node"]] + 0.4), ha="center", fontsize=8)
        for node in a.get("quarantined") or {}:  # hatched from then to the job's end
            if node in y and a.get("ended"):
                x = a["ended"] - t0
                ax.broken_barh(
                    [(x, max(last - x, 0.1))],
                    (y[node] - 0.35, 0.7),
                    facecolor="none",
                    edgecolor="#757575",
                    hatch="//",
                )
                ax.annotate("quarantined", (x, y[node] - 0.4), fontsize=7, color="#555555")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the job started")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
