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


def requests(checks, hosts) -> list:
    """The probe's requests for CHECKS: their facts, and for net_link the interface toward the
    first node (INTERFACES and ROUTE to its address)."""
    reqs = catalogue.facts_of(checks)
    if any(c.name == "net_link" for c in checks) and hosts:
        reqs += [factmod.INTERFACES, factmod.ROUTE(hosts[0].address)]
    return reqs


def contexts(hosts, facts: dict, windows: dict, thresholds: Thresholds = Thresholds()) -> dict[str, Context]:
    """Each answering node's Context: the controller's clock around its probe, the interface
    its traffic to the first node (of HOSTS, answering or not) takes, when the probe asked."""
    route = factmod.ROUTE(hosts[0].address) if hosts else None
    out = {}
    for h in (h for h in hosts if h.name in facts):
        v = facts[h.name]
        iface = factmod.reaching(v.get(factmod.INTERFACES) or {}, v.get(route)) if route and route in v else None
        out[h.name] = Context(thresholds, windows.get(h.name), iface)
    return out


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


def gather(fleet: Fleet, checks, hosts) -> tuple[dict, dict]:
    """({node: facts}, {node: Context}) from one probe per usable node."""
    reqs = requests(checks, hosts)
    windows: dict[str, tuple[float, float]] = {}

    def probe(s):
        t0 = time.time()
        values = factmod.gather(s, reqs, s.host.vars)
        windows[s.name] = (t0, time.time())
        return values
    facts = fleet.map(probe, "health")
    return facts, contexts(hosts, facts, windows)


def health(opts: HealthOptions, settings: Settings, events: Events) -> HealthResult:
    checks = catalogue.select(opts.checks)
    catalogue.check_ignored(opts.ignore)
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    with Fleet(hosts, settings, "health", events) as fleet:
        facts, ctxs = gather(fleet, checks, hosts)
        found = judge(checks, facts, ctxs)
        for node, why in fleet.unusable().items():
            found.append(Finding(node, "reach", "NODE_UNREACHABLE", Verdict.CRITICAL, why,
                                 "bring the node back (or leave it out with --limit '!NODE')"))
        report = fleet.report(inventory=inv.name)
    ignored = [f for f in found if f.code in opts.ignore and f.verdict is not Verdict.OK]
    kept = [f for f in found if f not in ignored]
    return HealthResult([h.name for h in hosts], kept, ignored, tuple(c.name for c in checks), report)
