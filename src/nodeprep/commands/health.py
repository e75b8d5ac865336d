"""`invoke health`: is every node fit to run a job. One probe per node gathers what the
selected checks read (ops/health/catalogue.py), the controller's clock brackets it (the
clock check), then each node's checks and the checks that compare nodes run on the
answers. A node that does not answer is itself a CRITICAL finding (NODE_UNREACHABLE).
With --drain / --undrain, Slurm is then told (ops/health/drain.py decides; scontrol runs on
the first node that answered, over its own ssh connection)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import HealthOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.facts.gpudeep import DCGM_DIAG, DCGM_TIMEOUT, GPU_DEEP, DcgmIn, DeepIn
from nodeprep.engine.facts.gpuhealth import GPU_DETAIL
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.transports import slurm, slurmrun
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.health import catalogue, deep, drain
from nodeprep.ops.health.findings import Context, Finding, Thresholds, Verdict, worst
from nodeprep.ops.train import quarantine
from nodeprep.settings import Settings


@dataclass
class HealthResult:
    nodes: list[str]
    findings: list[Finding]  # every finding, OK ones included
    ignored: list[Finding] = field(
        default_factory=list
    )  # non-OK findings whose code --ignore names
    checks: tuple[str, ...] = ()
    report: dict = field(default_factory=dict)
    slurm: list[tuple[drain.Action, str]] = field(
        default_factory=list
    )  # (action, "" or why it failed)

    def verdict(self, node: str) -> Verdict:
        return worst(f.verdict for f in self.findings if f.node == node)

    def unhealthy(self) -> list[str]:
        """The nodes with a CRITICAL finding (what the gate refuses)."""
        return [n for n in self.nodes if self.verdict(n) is Verdict.CRITICAL]

    def as_dict(self) -> dict:
        return {
            "nodes": {
                n: {
                    "verdict": self.verdict(n).name,
                    "findings": [f.as_dict() for f in self.findings if f.node == n],
                }
                for n in self.nodes
            },
            "unhealthy": self.unhealthy(),
            "ignored": [f.as_dict() for f in self.ignored],
            "checks": list(self.checks),
            "run_dir": self.report.get("run_dir"),
            **(
                {
                    "slurm": [
                        {
                            "node": a.node,
                            "slurm_node": a.slurm,
                            "action": a.op,
                            "why": a.why,
                            "reason": a.reason,
                            "error": err,
                        }
                        for a, err in self.slurm
                    ]
                }
                if self.slurm
                else {}
            ),
        }

    @property
    def exit_code(self) -> int:
        return 1 if self.unhealthy() or any(err for _a, err in self.slurm) else 0


def requests(checks, hosts) -> list:
    """The probe's requests for CHECKS: their facts, and for net_link the interface toward the
    first node (INTERFACES and ROUTE to its address)."""
    reqs = catalogue.facts_of(checks)
    if any(c.name == "net_link" for c in checks) and hosts:
        reqs += [factmod.INTERFACES, factmod.ROUTE(hosts[0].address)]
    return reqs


def contexts(
    hosts, facts: dict, windows: dict, thresholds: Thresholds = Thresholds(), emulate_gpus: int = 0
) -> dict[str, Context]:
    """Each answering node's Context: the controller's clock around its probe, the interface
    its traffic to the first node (of HOSTS, answering or not) takes, when the probe asked;
    the deep tier's emulation and the inventory's all_reduce floor."""
    route = factmod.ROUTE(hosts[0].address) if hosts else None
    out = {}
    for h in (h for h in hosts if h.name in facts):
        v = facts[h.name]
        iface = (
            factmod.reaching(v.get(factmod.INTERFACES) or {}, v.get(route))
            if route and route in v
            else None
        )
        out[h.name] = Context(thresholds, windows.get(h.name), iface, emulate_gpus, _floor(h))
    return out


def _floor(host) -> float | None:
    """The inventory's health_allreduce_floor_gbps for HOST (GB/s of busbw), None if unset."""
    v = host.vars.get("health_allreduce_floor_gbps")
    if v in (None, ""):
        return None
    try:
        if isinstance(v, bool) or float(v) <= 0:
            raise ValueError
        return float(v)
    except (TypeError, ValueError):
        raise InputError(
            f"{host.name}: health_allreduce_floor_gbps {v!r}: expected a positive number "
            "(GB/s of all_reduce bus bandwidth)",
            hint="fix it in the inventory",
        ) from None


def _run_check(check, node: str, facts, ctx) -> list[Finding]:
    """A check that fails on what it was given says so (UNKNOWN) and the others go on."""
    try:
        got = check.run(facts, ctx)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
        return [
            Finding(
                node,
                check.name,
                "CHECK_ERROR",
                Verdict.UNKNOWN,
                f"the {check.name} check could not read this node's answer "
                f"({type(e).__name__}: {e})",
                "report this with the node's `invoke facts --json` output",
            )
        ]
    return [Finding(node, check.name, *t) for t in got]


def _run_fleet_check(check, facts: dict, ctxs: dict) -> list[Finding]:
    try:
        got = check.run(facts, ctxs)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
        return [
            Finding(
                n,
                check.name,
                "CHECK_ERROR",
                Verdict.UNKNOWN,
                f"the {check.name} check failed ({type(e).__name__}: {e})",
                "report this",
            )
            for n in facts
        ]
    return [Finding(*t[:1], check.name, *t[1:]) for t in got]


def judge(checks, facts: dict, ctxs: dict[str, Context]) -> list[Finding]:
    """Every selected check on the nodes' facts ({node: FactValues}): pure, no I/O. A finding
    two checks give alike (the deep tier's missing torch) is kept once."""
    out: list[Finding] = []
    for check in checks:
        if check.fleet:
            out += _run_fleet_check(check, facts, ctxs)
        else:
            for node, f in facts.items():
                out += _run_check(check, node, f, ctxs[node])
    seen: set = set()
    return [
        f
        for f in out
        if (f.node, f.code, f.reason) not in seen and not seen.add((f.node, f.code, f.reason))
    ]


def gather(fleet: Fleet, checks, hosts, emulate_gpus: int = 0) -> tuple[dict, dict]:
    """({node: facts}, {node: Context}) from one probe per usable node."""
    reqs = requests(checks, hosts)
    windows: dict[str, tuple[float, float]] = {}

    def probe(s):
        t0 = time.time()
        values = factmod.gather(s, reqs, s.host.vars)
        windows[s.name] = (t0, time.time())
        return values

    facts = fleet.map(probe, "health")
    return facts, contexts(hosts, facts, windows, emulate_gpus=emulate_gpus)


def deep_requests(checks, passive, venv: str, opts: HealthOptions) -> list:
    """What the deep stage asks of one node, given its passive answers (PASSIVE)."""
    names = {c.name for c in checks if c.tier == "deep"}
    gpus = deep.has_gpus(passive)
    reqs = [DCGM_DIAG(DcgmIn(2))] if "dcgm_diag" in names and gpus else []
    if names & {"gpu_burn", "allreduce_node"} and (gpus or opts.emulate_gpus):
        reqs.append(
            GPU_DEEP(
                DeepIn(
                    venv,
                    opts.burn_seconds,
                    deep.message_bytes(passive.get(GPU_DETAIL)),
                    opts.emulate_gpus,
                )
            )
        )
    return reqs


def gather_deep(fleet: Fleet, checks, facts: dict, opts: HealthOptions) -> None:
    """The deep stage (minutes): one more probe per node that answered, its answers added to
    FACTS; a node that goes silent here is unreachable like any other."""
    if not any(c.tier == "deep" for c in checks):
        return
    limit = DCGM_TIMEOUT + opts.burn_seconds + 300

    def probe(s):
        reqs = deep_requests(
            checks, facts[s.name], s.host.vars.get("venv_path") or "~/.nodeprep/venv", opts
        )
        got = factmod.gather(s, reqs, s.host.vars, timeout=limit) if reqs else {}
        return {r.fact.key: got[r] for r in reqs}  # the checks read them by the fact itself

    for node, got in fleet.map(probe, "health --deep", only=[n for n in facts]).items():
        facts[node].update(got)
    for node in [n for n in facts if n in fleet.unusable()]:
        del facts[node]


def tell_slurm(fleet: Fleet, hosts, res: HealthResult, opts: HealthOptions) -> None:
    """--drain / --undrain: the nodes' CRITICAL codes told to Slurm (slurm_actions), each
    action with its outcome in RES.slurm."""
    critical: dict[str, list[str]] = {}
    for f in res.findings:
        if f.verdict is Verdict.CRITICAL:
            critical.setdefault(f.node, []).append(f.code)
    res.slurm.extend(slurm_actions(fleet, hosts, critical, res.nodes, opts.drain, opts.undrain))


def slurm_actions(fleet: Fleet, hosts, critical: dict, nodes: list, drain_: bool, undrain: bool):
    """[(drain.Action, its error or "")]: Slurm's view of HOSTS read on the first of them that
    answered in FLEET, what to do to each of NODES given CRITICAL ({node: codes};
    drain.actions_for), then one scontrol per change."""
    head = next(
        (fleet.sessions[h.name] for h in hosts if h.name in {s.name for s in fleet.usable()}), None
    )
    if head is None:
        raise NodeprepError(
            "--drain/--undrain: no node answered, and scontrol runs on one",
            hint="bring a node of the cluster back, then run again",
        )
    r = head.run_ssh(
        f"command -v scontrol >/dev/null || echo '@@missing scontrol'; {slurm.SINFO} && "
        f"echo @@state && {drain.STATE}",
        60,
        "slurm: nodes and their states (sinfo)",
    )
    if "@@missing scontrol" in r.stdout:
        raise InputError(
            f"--drain/--undrain: scontrol not found on {head.name} (the first node that "
            "answered runs the Slurm commands)",
            hint="run against a Slurm cluster's nodes, or leave out --drain/--undrain",
        )
    if r.rc != 0 or "@@state" not in r.stdout:
        raise NodeprepError(
            f"--drain/--undrain: sinfo on {head.name} failed: {r.tail(2)}",
            hint="is slurmctld up? `sinfo -N` on that node says",
        )
    names_text, _, state_text = r.stdout.partition("@@state\n")
    names = {}
    for h in hosts:  # a node Slurm does not list is said so, not an error
        try:
            names.update(slurm.node_map([h], names_text, head.name))
        except InputError:
            pass
    out = []
    for a in drain.actions_for(
        critical, nodes, names, drain.parse_state(state_text), drain_, undrain
    ):
        err = ""
        if a.op != "keep":
            done = head.run_ssh(drain.script(a), 30, f"slurm: {a.op} {a.slurm}")
            err = "" if done.ok else (done.tail(2) or f"exit {done.rc}")
        out.append((a, err))
    return out


def quarantined(hosts, settings: Settings) -> list[Finding]:
    """A node `train --restarts` quarantined: CRITICAL (train leaves it out) until released."""
    held = quarantine.load(settings.state)
    return [
        Finding(
            h.name,
            "quarantine",
            "QUARANTINED",
            Verdict.CRITICAL,
            quarantine.line(h.name, held[h.name]),
            f"once it is fixed: invoke train.release --node {h.name}",
        )
        for h in hosts
        if h.name in held
    ]


def health(opts: HealthOptions, settings: Settings, events: Events) -> HealthResult:
    checks = catalogue.select(opts.checks, opts.deep)
    catalogue.check_ignored(opts.ignore)
    if not 0 <= opts.emulate_gpus <= 16 or not 1 <= opts.burn_seconds <= 600:
        raise InputError(
            f"--emulate-gpus {opts.emulate_gpus} / --burn-seconds {opts.burn_seconds:g}: "
            "expected 0-16 devices and 1-600 seconds"
        )
    if (opts.emulate_gpus or opts.burn_seconds != 10.0) and not any(
        c.tier == "deep" for c in checks
    ):
        raise InputError(
            "--emulate-gpus and --burn-seconds belong to the deep tier",
            hint="add --deep (or --check gpu_burn / allreduce_node)",
        )
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    via = opts.via
    slurmrun.resolve(via, hosts)  # a bad --via: exit 2 before any node is touched
    if opts.undrain:  # a drained node takes no srun step: probe it over ssh
        if via == "slurm":
            raise InputError(
                "--undrain --via slurm: Slurm runs no step on a drained node, so the "
                "nodes to return could not be probed",
                hint="use --via ssh (the default outside an allocation)",
            )
        via = "ssh"
    with Fleet(hosts, settings, "health", events) as fleet:
        slurmrun.use(fleet, via)
        facts, ctxs = gather(fleet, checks, hosts, opts.emulate_gpus)
        gather_deep(fleet, checks, facts, opts)
        found = judge(checks, facts, {n: ctxs[n] for n in facts})
        for node, why in fleet.unusable().items():
            found.append(
                Finding(
                    node,
                    "reach",
                    "NODE_UNREACHABLE",
                    Verdict.CRITICAL,
                    why,
                    "bring the node back (or leave it out with --limit '!NODE')",
                )
            )
        found += quarantined(hosts, settings)
        ignored = [f for f in found if f.code in opts.ignore and f.verdict is not Verdict.OK]
        res = HealthResult(
            [h.name for h in hosts],
            [f for f in found if f not in ignored],
            ignored,
            tuple(c.name for c in checks),
        )
        if opts.drain or opts.undrain:
            tell_slurm(fleet, hosts, res, opts)
        res.report = fleet.report(inventory=inv.name)
    return res
