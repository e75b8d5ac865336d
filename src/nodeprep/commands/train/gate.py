"""The health gate before a launch: the passive health checks (ops/health) on the answers of
the same probe that prepares the job (no round trip of its own), then the launch refused on a
CRITICAL finding, naming node and code, or, with --exclude-unhealthy, planned on the healthy
nodes only (the launchers then get a hostfile / node list without them). `gpu_busy` is left to
preflight, which names an earlier job's processes and stops them under --kill-stale."""

from __future__ import annotations

from nodeprep.commands import health
from nodeprep.commands.options import TrainOptions
from nodeprep.engine.events import Events
from nodeprep.errors import NodeprepError
from nodeprep.ops.health import catalogue
from nodeprep.ops.health.findings import Finding, Verdict

CHECKS = tuple(c for c in catalogue.CHECKS if c.tier == "passive" and c.name != "gpu_busy")


def requests(hosts) -> list:
    """What the gate adds to the job's probe."""
    return health.requests(CHECKS, hosts)


def critical(hosts, facts: dict, windows: dict, ignore: tuple[str, ...]) -> list[Finding]:
    ctxs = health.contexts(hosts, facts, windows)
    found = health.judge(CHECKS, {h.name: facts[h.name] for h in hosts}, ctxs)
    return [f for f in found if f.verdict is Verdict.CRITICAL and f.code not in ignore]


def apply(opts: TrainOptions, hosts, facts: dict, windows: dict, events: Events) -> list:
    """The hosts the job launches on: all of them when none is CRITICAL; else the launch is
    refused, or (with --exclude-unhealthy) the healthy ones (refused when none is left)."""
    if not opts.health_gate:
        return hosts
    bad = critical(hosts, facts, windows, opts.health_ignore)
    if not bad:
        return hosts
    lines = [f"{f.node}: {f.code}: {f.reason}" for f in bad]
    unhealthy = sorted({f.node for f in bad})
    if opts.exclude_unhealthy:
        kept = [h for h in hosts if h.name not in unhealthy]
        if kept:
            events.note(
                kept[0].name,
                f"health gate: left out {', '.join(unhealthy)} "
                f"({'; '.join(f'{f.node} {f.code}' for f in bad)})",
            )
            return kept
    raise NodeprepError(
        "health gate: not launching on unhealthy nodes:\n  " + "\n  ".join(lines),
        hint="fix them (`invoke health` gives each fix), --exclude-unhealthy to launch "
        "on the others, --health-ignore CODE, or --no-health-gate",
    )
