"""`invoke doctor`: the controller (keys, agent, ssh config blocks and aliases, labs, Python
and the tool's pins) and first contact with the inventory's nodes (reach, auth, host key,
sudo where a role needs it, python, the named modules, the launchers' programs on the
non-interactive PATH, room for the venv), each finding with the command that fixes it. Every
check runs on its own: one that crashes is a CHECK_CRASHED finding and the others go on.
Nothing is changed on a node; a first contact pins the node's host key as every command does.

Without --inventory, the default inventory's nodes are checked when it exists, else only the
controller (the result says so)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Callable

from nodeprep.commands.common import parse_sets, select_hosts
from nodeprep.commands.options import DoctorOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.errors import InputError
from nodeprep.inventory.schema import load_schema
from nodeprep.ops.doctor import catalogue, controller_view, node
from nodeprep.ops.health.findings import Finding, Verdict, worst
from nodeprep.ops.provision.shells import want_shell
from nodeprep.settings import Settings

CONTROLLER = "controller"


@dataclass
class DoctorResult:
    checks: tuple[str, ...]
    findings: list[Finding]  # every finding, OK ones included
    nodes: list[str] = field(default_factory=list)
    _: KW_ONLY
    inventory: str | None = None
    skipped: str = ""  # why the node checks did not run

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict is not Verdict.OK]

    def verdict(self, check: str) -> Verdict:
        return worst(f.verdict for f in self.findings if f.check == check)

    def as_dict(self) -> dict:
        return {
            "inventory": self.inventory,
            "nodes": self.nodes,
            "skipped": self.skipped or None,
            "checks": {
                c: {
                    "status": self.verdict(c).name,
                    "findings": [f.as_dict() for f in self.findings if f.check == c],
                }
                for c in self.checks
            },
            "problems": len(self.problems()),
        }

    @property
    def exit_code(self) -> int:
        return 1 if self.problems() else 0


def _run(check, arg, subject: str | None) -> list[Finding]:
    """CHECK over ARG as findings; a crash is one CHECK_CRASHED finding, never raised."""
    try:
        got = check.run(arg)
    except Exception as e:  # a bug or an answer the check did not expect: the rest go on
        return [
            Finding(
                subject or "fleet",
                check.name,
                "CHECK_CRASHED",
                Verdict.UNKNOWN,
                f"the check crashed: {type(e).__name__}: {e}",
                "the other checks ran; report this with `invoke doctor --json` attached",
            )
        ]
    if subject is not None:
        return [Finding(subject, check.name, code, v, reason, fix) for code, v, reason, fix in got]
    return [Finding(n, check.name, code, v, reason, fix) for n, code, v, reason, fix in got]


def _inventory(opts: DoctorOptions, settings: Settings, events: Events):
    """(inventory, hosts, why the node checks are skipped, the refusal (message, fix) or None).
    A missing default inventory skips the node checks; an inventory that does not load, or a
    selected host nodeprep refuses, is the `inventory` check's finding."""
    sets = parse_sets(opts.sets)  # a bad --set is a bad flag: exit 2
    try:
        inv, hosts = select_hosts(opts.inventory, opts.limit, settings, sets, events)
        return inv, hosts, "", None
    except InputError as e:
        if "not found" in e.message and opts.inventory is not None:
            raise  # a mistyped --inventory: exit 2
        if "not found" in e.message:
            return (
                None,
                [],
                (
                    f"no inventory given and the default '{settings.default_inventory}' does not "
                    "exist: node checks skipped (--inventory NAME, or invoke init NAME --from ...)"
                ),
                None,
            )
        return (
            None,
            [],
            "node checks skipped: the inventory was refused (see inventory)",
            (e.message, e.hint or ""),
        )


def _vars(hosts) -> dict[str, dict]:
    defaults = {k: spec.default for k, spec in load_schema().items()}
    return {h.name: {**defaults, **h.vars} for h in hosts}


def _first(s, all_vars: dict):
    """A node's first probe: its user, login shell, Python, OS, the launchers' programs, GPUs,
    the room and venv where its venv goes, and its named modules (nothing where none are)."""
    v = all_vars[s.name]
    return factmod.gather(
        s,
        [
            factmod.USER,
            factmod.LOGIN_SHELL,
            factmod.PYTHON,
            factmod.OS,
            factmod.PROGRAMS,
            factmod.GPUS,
            factmod.ROOM(v["venv_path"]),
            factmod.VENV(v["venv_path"]),
            factmod.MODULES,
        ],
        s.host.vars,
    )


def _second(s, all_vars: dict, got: dict, wanted: tuple):
    """A node's second probe, from its first's answers: sudo for the shell the shell role
    wants, and where a login finds the launchers' programs (WANTED) it lacks."""
    f, v = got[s.name], all_vars[s.name]
    cur, user = f.get(factmod.LOGIN_SHELL), (f.get(factmod.USER) or {}).get("name", "")
    lack = tuple(p for p in wanted if p not in (f.get(factmod.PROGRAMS) or ()))
    reqs = [factmod.SUDO((want_shell(v, cur), user))] + (
        [factmod.LOGIN_FINDS(lack)] if lack else []
    )
    more = factmod.gather(s, reqs, s.host.vars)
    return {"sudo": more.get(reqs[0]), "login_finds": more.get(reqs[1]) if lack else {}}


def _contact(h, s, got: dict, extra: dict, all_vars: dict, spec: str) -> node.Contact:
    """Host H's Contact: how its session went (S), and its probes' facts."""
    f, venv = got.get(h.name) or factmod.FactValues(), all_vars[h.name]["venv_path"]
    facts = factmod.FactValues(
        {
            **f,
            **(extra.get(h.name) or {}),
            "room": f.get(factmod.ROOM(venv)),
            "venv": f.get(factmod.VENV(venv)),
        }
    )
    return node.Contact(
        h.name,
        h.address,
        int(h.port),
        user=h.user,
        key=h.key,
        vars=all_vars[h.name],
        reached=s.result.usable and h.name in got,
        error_kind=s.result.error_kind,
        message=s.result.message,
        login=s.login() if s.connected else {},
        facts=facts,
        inventory=spec,
    )


def _contacts(
    hosts, all_vars: dict, settings: Settings, events: Events, spec: str
) -> list[node.Contact]:
    with Fleet(hosts, settings, "doctor", events) as fleet:
        got = fleet.map(lambda s: _first(s, all_vars), "probe")
        mpi = any("mpirun" in (f.get(factmod.PROGRAMS) or ()) for f in got.values())
        wanted = ("pdsh", "mpirun", "orted") if mpi else ("pdsh",)
        extra = fleet.map(lambda s: _second(s, all_vars, got, wanted), "probe", only=list(got))
        return [_contact(h, fleet.sessions[h.name], got, extra, all_vars, spec) for h in hosts]


def doctor(
    opts: DoctorOptions, settings: Settings, events: Events, labs: Callable[[], list] = lambda: []
) -> DoctorResult:
    """LABS: () -> [(lab, problem, fix)] of the emulated labs (the cli passes lab.leftovers)."""
    checks = catalogue.select(opts.checks)
    inv, hosts, skipped, refused = _inventory(opts, settings, events)
    all_vars = _vars(hosts)
    first = all_vars[hosts[0].name] if hosts else {k: s.default for k, s in load_schema().items()}
    findings: list[Finding] = []
    if any(c.tier == "controller" for c in checks):
        view = controller_view.look(
            settings.project,
            Path(str(first["controller_ssh_config"])).expanduser(),
            inv,
            hosts,
            str(first.get("ssh_alias_prefix") or ""),
        )
        view.labs = labs() if any(c.name == "labs" for c in checks) else []
        view.hosts, view.inventory_error = len(hosts), refused
        findings += [f for c in checks if c.tier == "controller" for f in _run(c, view, CONTROLLER)]
    node_checks = [c for c in checks if c.tier == "node"]
    if node_checks and hosts:
        spec = f" --inventory {opts.inventory}" if opts.inventory else ""
        contacts = _contacts(hosts, all_vars, settings, events, spec)
        findings += [f for c in node_checks for f in _run(c, contacts, None)]
    return DoctorResult(
        tuple(c.name for c in checks),
        findings,
        [h.name for h in hosts],
        inventory=inv.name if inv is not None else None,
        skipped=skipped if node_checks else "",
    )
