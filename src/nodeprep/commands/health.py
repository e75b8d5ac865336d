"""`invoke health`: is every node fit to run a job. One probe per node gathers what the
selected checks read (ops/health/catalogue.py), the controller's clock brackets it (the
clock check), then each node's checks and the checks that compare nodes run on the
answers. A node that does not answer is itself a CRITICAL finding (NODE_UNREACHABLE)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import HealthOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.ops.health import catalogue
from nodeprep.ops.health.findings import Context, Finding, Thresholds, Verdict, worst
from nodeprep.settings import Settings


@dataclass
class HealthResult:
    nodes: list[str]
    findings: list[Finding]                 # every finding, OK ones included
    ignored: list[Finding] = field(default_factory=list)     # non-OK findings whose code --ignore names
    checks: tuple[str, ...] = ()
    report: dict = field(default_factory=dict)

    def verdict(self, node: str) -> Verdict:
        return worst(f.verdict for f in self.findings if f.node == node)

    def unhealthy(self) -> list[str]:
        """The nodes with a CRITICAL finding (what the gate refuses)."""
        return [n for n in self.nodes if self.verdict(n) is Verdict.CRITICAL]

    def as_dict(self) -> dict:
        return {"nodes": {n: {"verdict": self.verdict(n).name,
                              "findings": [f.as_dict() for f in self.findings if f.node == n]} for n in self.nodes},
                "unhealthy": self.unhealthy(), "ignored": [f.as_dict() for f in self.ignored],
                "checks": list(self.checks), "run_dir": self.report.get("run_dir")}

    @property
    def exit_code(self) -> int:
        return 1 if self.unhealthy() else 0


def _interface(values, head_route) -> str | None:
    ifs = values.get(factmod.INTERFACES) or {}
    return factmod.reaching(ifs, values.get(head_route)) if head_route is not None else None


def _run_check(check, node: str, facts, ctx) -> list[Finding]:
    """A check that fails on what it was given says so (UNKNOWN) and the others go on."""
    try:
        got = check.run(facts, ctx)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
        return [Finding(node, check.name, "CHECK_ERROR", Verdict.UNKNOWN,
                        f"the {check.name} check could not read this node's answer ({type(e).__name__}: {e})",
                        "report this with the node's `invoke facts --json` output")]
    return [Finding(node, check.name, *t) for t in got]


def _run_fleet_check(check, facts: dict, ctxs: dict) -> list[Finding]:
    try:
        got = check.run(facts, ctxs)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
        return [Finding(n, check.name, "CHECK_ERROR", Verdict.UNKNOWN,
                        f"the {check.name} check failed ({type(e).__name__}: {e})", "report this") for n in facts]
    return [Finding(*t[:1], check.name, *t[1:]) for t in got]


def judge(checks, facts: dict, ctxs: dict[str, Context]) -> list[Finding]:
    """Every selected check on the nodes' facts ({node: FactValues}): pure, no I/O."""
    out: list[Finding] = []
    for check in checks:
        if check.fleet:
            out += _run_fleet_check(check, facts, ctxs)
        else:
            for node, f in facts.items():
                out += _run_check(check, node, f, ctxs[node])
    return out


def gather(fleet: Fleet, checks, hosts, thresholds: Thresholds) -> tuple[dict, dict]:
    """({node: facts}, {node: Context}) from one probe per usable node."""
    requests = catalogue.facts_of(checks)
    head_route = None
    if any(c.name == "net_link" for c in checks) and hosts:
        head_route = factmod.ROUTE(hosts[0].address)
        requests = requests + [factmod.INTERFACES, head_route]
    windows: dict[str, tuple[float, float]] = {}

    def probe(s):
        t0 = time.time()
        values = factmod.gather(s, requests, s.host.vars)
        windows[s.name] = (t0, time.time())
        return values
    facts = fleet.map(probe, "health")
    ctxs = {n: Context(thresholds, windows.get(n), _interface(v, head_route)) for n, v in facts.items()}
    return facts, ctxs


def health(opts: HealthOptions, settings: Settings, events: Events) -> HealthResult:
    checks = catalogue.select(opts.checks)
    catalogue.check_ignored(opts.ignore)
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    with Fleet(hosts, settings, "health", events) as fleet:
        facts, ctxs = gather(fleet, checks, hosts, Thresholds())
        found = judge(checks, facts, ctxs)
        for node, why in fleet.unusable().items():
            found.append(Finding(node, "reach", "NODE_UNREACHABLE", Verdict.CRITICAL, why,
                                 "bring the node back (or leave it out with --limit '!NODE')"))
        report = fleet.report(inventory=inv.name)
    ignored = [f for f in found if f.code in opts.ignore and f.verdict is not Verdict.OK]
    kept = [f for f in found if f not in ignored]
    return HealthResult([h.name for h in hosts], kept, ignored, tuple(c.name for c in checks), report)
