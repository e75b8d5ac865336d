"""`invoke provision`: validate, probe every node once, plan the steps of every role, apply
only what differs (one batched command per node, re-reading the facts it touched in the same
round trip), and report per node and per step.

A node with nothing to change costs one round trip. --check stops after the plan and lists
what would change (--diff: the file diffs, secrets redacted).
"""

from __future__ import annotations

import hashlib
from dataclasses import KW_ONLY, dataclass, field

from nodeprep.commands.common import parse_sets, select_hosts
from nodeprep.commands.options import ProvisionOptions
from nodeprep.commands.waves import Waves, node_steps, probe
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.locks import Lock, Locks, Owner
from nodeprep.engine.transports import slurmrun
from nodeprep.errors import InputError
from nodeprep.inventory.nodeset import fold
from nodeprep.ops import pystack
from nodeprep.ops.provision import roles as rolemod
from nodeprep.ops.provision.topology import Topology
from nodeprep.ops.pystack import tags
from nodeprep.redact import Redactor
from nodeprep.settings import Settings

HOME_LOCK = "~/.nodeprep/lock"


@dataclass
class ProvisionResult:
    report: dict  # the run report (per node, per step)
    check_mode: bool  # --check: "would change"
    controller: list = field(default_factory=list)  # StepResults of the controller's own work
    _: KW_ONLY
    notes: list = field(default_factory=list)  # things to tell the user once
    diffs: list = field(default_factory=list)  # --diff: one text per differing file
    redact: Redactor = field(default_factory=lambda: Redactor([]))

    @property
    def exit_code(self) -> int:
        return 1 if self.report["failed"] or self.report["unreachable"] else 0


def _diffs(differ: dict, redact: Redactor) -> list[str]:
    return [
        redact(f"--- {node}: {st.role}: {st.name}\n{c.diff}")
        for node, items in differ.items()
        for st, c in items
        if c.diff
    ]


def _platform_mix(prov: rolemod.Provisioning) -> None:
    """Nodes sharing a home must share a venv path only if they share a platform."""
    for nodes in prov.topology.homes.values():
        by_path: dict[str, set] = {}
        for n in nodes:
            f, v = prov.facts.get(n) or {}, prov.vars[n]
            py = f.get(factmod.PYTHON) or {}
            plat = (
                (f.get(factmod.OS) or {}).get("arch"),
                py.get("version", "")[:4],
                py.get("glibc"),
            )
            by_path.setdefault(v["venv_path"], set()).add(plat)
        for path, plats in by_path.items():
            if len(plats) > 1:
                raise InputError(
                    f"{fold(nodes)} share one home but not a platform "
                    f"({'; '.join(sorted(' '.join(map(str, p)) for p in plats))}): one venv at "
                    f"{path} cannot serve them all",
                    hint="give each platform group its own venv_path in group_vars "
                    "(e.g. group_vars/aarch64.yml: venv_path: ~/.nodeprep/venv-aarch64)",
                )
    _foreign_venvs(prov)


def _foreign_venvs(prov: rolemod.Provisioning) -> None:
    """A venv already at a node's venv_path whose compiled wheels are for another CPU (its home
    is shared with nodes of another platform, which provisioned it in an earlier run) is
    refused before anything changes: replacing it would break those nodes, installing into it
    leaves wheels pip keeps because their versions match."""
    found: dict[tuple, list[str]] = {}
    for n, f in prov.facts.items():
        venv, arch = prov.vars[n]["venv_path"], (f.get(factmod.OS) or {}).get("arch")
        foreign = pystack.foreign_packages(f.get(factmod.VENV(venv)), arch)
        if foreign:
            found.setdefault((venv, arch, *tags.describe(foreign)), []).append(n)
    if found:  # one line: the first group (by path); the others share its fix
        (venv, arch, names, other), nodes = min(found.items())
        raise InputError(
            f"{fold(nodes)}: {venv} holds a venv built for {other} ({names}); these nodes "
            f"are {arch}: one venv cannot serve both platforms",
            hint=f"give the {arch} nodes their own venv_path and wheelhouse_dir (e.g. "
            f"group_vars/{arch}.yml: venv_path: ~/.nodeprep/venv-{arch}, wheelhouse_dir: "
            f"~/.nodeprep/wheelhouse-{arch}); or, if no {other} node uses this home, "
            f"remove it on them: rm -rf {venv}",
        )


def _locks(fleet, prov: rolemod.Provisioning) -> Locks:
    """One lock per home and one per machine, each taken on the node that acts for it."""
    topo, out = prov.topology, []
    for nodes in topo.homes.values():
        out.append(Lock(nodes[0], HOME_LOCK, f"home of {fold(nodes)}"))
    for key, nodes in topo.by_machine_id.items():
        uid = ((prov.facts.get(nodes[0]) or {}).get(factmod.USER) or {}).get("uid", "x")
        tag = hashlib.sha256(key.encode()).hexdigest()[:12]
        out.append(Lock(nodes[0], f"/tmp/nodeprep-{uid}-{tag}.lock", f"machine of {fold(nodes)}"))
    return Locks(fleet, out, Owner.me(fleet.run_id))


def _converged(prov: rolemod.Provisioning, roles, early: dict) -> bool:
    """Whether every step of every probed node already matches the probe's facts. A run that
    would change nothing takes no lock (two round trips per node saved: its cost is the probe);
    one that would, or that cannot tell from the probe alone, takes the locks and goes the
    whole way. EARLY gets each node's steps with the facts they were planned from."""
    hosts = {h.name: h for h in prov.hosts}
    for name, facts in prov.facts.items():
        try:
            steps = node_steps(rolemod.Ctx(hosts[name], prov), roles)
            early[name] = (facts, steps)
            if not all(all(r in facts for r in st.reads) and st.check(facts).ok for st in steps):
                return False
        except Exception:  # the waves plan it again and report why, under the locks
            return False
    return True


def validated(opts: ProvisionOptions, settings: Settings, events: Events):
    """(roles, prov): the inventory read and every role's `validate` passed; InputError
    otherwise, and no node touched yet."""
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, parse_sets(opts.sets), events)
    roles = rolemod.load(opts.roles, settings.roles_dir)
    prov = rolemod.Provisioning(inv, hosts, settings, opts.check_mode, events=events)
    prov.vars = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    for role in roles:
        role.call("validate", prov)
    return roles, prov


def provision(opts: ProvisionOptions, settings: Settings, events: Events) -> ProvisionResult:
    roles, prov = validated(opts, settings, events)
    inv, hosts = prov.inventory, prov.hosts
    order = [h.name for h in hosts]
    with Fleet(hosts, settings, "provision", events, password=opts.password) as fleet:
        # --via slurm: every stage's runs as srun steps (and the wheels go by sbcast)
        prov.shared.via = slurmrun.use(fleet, opts.via)
        prov.facts = fleet.map(lambda s: probe(s, roles, prov), "facts")
        prov.topology = Topology.of(prov.facts, order)
        _platform_mix(prov)
        for line in prov.topology.describe():
            events.log(line)
            prov.notes.append(line)
        locks = None
        try:
            controller = [res for role in roles for res in (role.call("controller", prov) or [])]
            early: dict = {}
            converged = not opts.check_mode and _converged(prov, roles, early)
            if not opts.check_mode and not converged:
                locks = _locks(fleet, prov)
                if locks.acquire(settings.lock_wait, settings.lock_stale):
                    # another run held the lock: the nodes may have changed since the probe
                    prov.facts = fleet.map(lambda s: probe(s, roles, prov), "facts")
            # a converged fleet's plans stand (nothing will change, nothing is read again);
            # otherwise a node's plan may read what another node's actions change
            waves = Waves(fleet, roles, prov, opts.check_mode, early if converged else None)
            waves.all(order)
            for s in fleet.usable():
                ctx = rolemod.Ctx(s.host, prov)
                for role in roles:
                    s.result.data.update(role.call("report", ctx) or {})
        finally:
            if locks:
                locks.release()
        report = fleet.report(
            inventory=inv.name,
            check=opts.check_mode,
            controller=[c.as_dict() for c in controller],
            notes=prov.notes,
        )
    redact = waves.redactor()
    return ProvisionResult(
        report,
        opts.check_mode,
        controller,
        notes=prov.notes,
        diffs=_diffs(waves.differ, redact) if opts.diff else [],
        redact=redact,
    )
