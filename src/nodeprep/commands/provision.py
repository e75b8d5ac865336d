"""`invoke provision`: validate, probe every node once, plan the steps of every role, apply
only what differs (one batched command per node, re-reading the facts it touched in the same
round trip), and report per node and per step.

A node with nothing to change costs one round trip. --check stops after the plan and lists
what would change (--diff: the file diffs, secrets redacted).
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from nodeprep.commands.common import parse_sets, select_hosts
from nodeprep.commands.options import ProvisionOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine.transports import slurmrun
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.locks import Lock, Locks, Owner
from nodeprep.engine.results import StepResult
from nodeprep.engine.steps import Step, action_for
from nodeprep.errors import InputError, NodeprepError
from nodeprep.inventory.nodeset import fold
from nodeprep.ops.provision import roles as rolemod
from nodeprep.ops.provision.topology import Topology
from nodeprep.redact import Redactor, is_secret
from nodeprep.settings import Settings

HOME_LOCK = "~/.nodeprep/lock"


def _redactor(prov: rolemod.Provisioning, steps: list[Step]) -> Redactor:
    """Secrets are the values of secret-looking names in the environment mappings that reach
    the ranks, plus what steps declare (e.g. the cluster private key). Inventory variables such
    as `key` or `controller_key` are paths, not secrets."""
    values = [str(v) for vs in prov.vars.values() for m in ("deepspeed_env", "nccl_env")
              for k, v in (vs.get(m) or {}).items() if is_secret(k)]
    values += [s for st in steps for s in st.secrets]
    return Redactor(values)


def apply_script(changes: list[tuple[Step, str]], rereads: list, token: str) -> str:
    """Run the actions in order, stopping at the first failure, then re-read their facts."""
    parts = ["np_fail=0"]
    for i, (_step, action) in enumerate(changes):
        parts.append(
            f"echo '@@{token}:a{i}@@'\n"
            f"if [ $np_fail -eq 0 ]; then ( {action}\n) 2>&1 </dev/null; np_rc=$?\n"
            f"  [ $np_rc -eq 0 ] || np_fail=1\nelse echo '@@skipped@@'; np_rc=0; fi\n"
            f"echo \"@@{token}:rc=$np_rc@@\"")
    return "\n".join(parts) + "\n" + factmod.probe_script(rereads, {}, token)


def _plan_node(ctx: rolemod.Ctx, roles: list[rolemod.Role]) -> list[Step]:
    steps = []
    for role in roles:
        for st in role.call("steps", ctx, default=[]) or []:
            st.role = role.name
            steps.append(st)
    return steps


def _shared_result(st: Step, c, actor: str, check_mode: bool) -> StepResult:
    """A step another node acts for (it shares this node's home or machine): verified only."""
    name, where = f"{st.role}: {st.name}", f"shared {st.scope}"
    if c.ok:
        return StepResult(name, "ok", f"by {actor} ({where})")
    if check_mode:
        return StepResult(name, "skipped", f"{actor} acts for the {where}")
    return StepResult(name, "failed", f"still differs after {actor} acted for the {where}: {c.why}"
                      "; a value that differs per node cannot live in a shared file")


def _check_all(session, steps: list[Step], facts: dict, check_mode: bool, actor=None):
    """Compare every step with the facts; returns [(step, Check)] of those that differ and
    this node acts on. ACTOR(step): the node that acts for the step's scope (default: this)."""
    differ = []
    # Facts a role did not declare up front cost one more round trip, not a failure.
    missing = list(dict.fromkeys(r for st in steps for r in st.reads if r not in facts))
    if missing:
        facts.update(factmod.gather(session, missing))
    for st in steps:
        c = st.check(facts)
        by = actor(st) if actor else session.name
        if by != session.name:
            session.result.add_step(_shared_result(st, c, by, check_mode))
        elif c.ok:
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "ok"))
        elif st.action is None:
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "failed",
                                               c.why + (f"; {st.hint}" if st.hint else "")))
        else:
            differ.append((st, c))
            if check_mode:
                session.result.add_step(StepResult(f"{st.role}: {st.name}", "changed",
                                                   "would change: " + c.why))
    return differ


def _apply(session, differ, facts: dict, redact: Redactor) -> None:
    if session.result.status == "failed":   # a step nodeprep cannot fix already failed
        for st, _c in differ:
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "skipped",
                                               "not applied: an earlier step failed"))
        return
    for i, (st, _c) in enumerate(differ):
        if st.before is None:
            continue
        session.events.status(session.name, "apply", "running", f"upload for {st.role}: {st.name}")
        try:
            st.before(session, facts)
        except (OSError, NodeprepError) as e:   # an upload failed: nothing after it runs
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "failed", str(e)))
            for later, _ in differ[i + 1:]:
                session.result.add_step(StepResult(f"{later.role}: {later.name}", "skipped",
                                                   "an earlier step failed"))
            differ = differ[:i]
            break
    if not differ:
        return
    token = secrets.token_hex(6)
    changes, view = [], factmod.FactValues(facts)
    for st, _c in differ:     # each action planned on the node as the earlier ones leave it
        changes.append((st, action_for(st, view)))
        if st.after:
            view.update(st.after(view))
    rereads = list(dict.fromkeys(r for st, _c in differ for r in st.reads))
    names = [f"{st.role}: {st.name}" for st, _ in changes]
    marks = {f"@@{token}:a{i}@@": i for i in range(len(changes))}

    def progress(line: str):   # the live display shows the step the node is in now
        i = marks.get(line)
        if i is not None:
            session.events.status(session.name, "apply", "running",
                                   f"step {i + 1}/{len(names)}: {names[i]}")
    r = session.run(apply_script(changes, rereads, token),
                    label=f"apply {len(changes)} step(s): " + ", ".join(s.name for s, _ in changes)[:250],
                    log_output=False, on_line=progress)
    sections = factmod.split_sections(r.stdout, token)
    after = facts          # updated in place: reports and later stages see the node as it is now
    if all(t in sections for t in factmod.section_tags(rereads)):
        after.update(factmod.parse_sections(session.name, rereads, r.stdout, token, r.rc))
    for i, (st, c) in enumerate(differ):
        label = f"{st.role}: {st.name}"
        out, rc = sections.get(f"a{i}", ("", None))
        if rc is None:
            session.result.add_step(StepResult(label, "failed", f"no result (exit {r.rc})"),
                                    redact(r.tail()))
        elif out.strip() == "@@skipped@@":
            session.result.add_step(StepResult(label, "skipped", "an earlier step failed"))
        elif rc != 0:
            tail = "\n".join(out.strip().splitlines()[-12:])
            session.result.add_step(StepResult(label, "failed", f"exit {rc}" + (
                f"; {st.hint}" if st.hint else "")), redact(tail))
        else:
            again = st.check(after)
            status, msg = ("changed", c.why) if again.ok else ("failed", "still differs after "
                                                                f"applying: {again.why}")
            session.result.add_step(StepResult(label, status, msg))


@dataclass
class ProvisionResult:
    report: dict                      # the run report (per node, per step)
    check: bool                       # --check: "would change"
    controller: list = field(default_factory=list)   # StepResults of the controller's own work
    notes: list = field(default_factory=list)        # things to tell the user once
    diffs: list = field(default_factory=list)        # --diff: one text per differing file
    redact: Redactor = field(default_factory=lambda: Redactor([]))

    @property
    def exit_code(self) -> int:
        return 1 if self.report["failed"] or self.report["unreachable"] else 0


def _probe(s, roles, prov) -> factmod.FactValues:
    ctx = rolemod.Ctx(s.host, prov)
    reqs = [factmod.HOSTNAME, factmod.IDENTITY] + [f for r in roles for f in r.facts()]
    reqs += [q for r in roles for q in r.reads(ctx)]
    return factmod.gather(s, list(dict.fromkeys(reqs)), prov.vars[s.name])


def _diffs(differ: dict, redact: Redactor) -> list[str]:
    return [redact(f"--- {node}: {st.role}: {st.name}\n{c.diff}")
            for node, items in differ.items() for st, c in items if c.diff]


def _passes(differ: dict) -> list[dict]:
    """A wave's apply passes, {node: [(step, check)]} each: a node's differing steps are cut
    before each step that waits for fleet-level work (Step.fleet); usually one pass."""
    passes: list[dict] = [{}]
    for node, items in differ.items():
        k = 0
        for st, c in items:
            k += bool(st.fleet)
            passes += [{} for _ in range(k + 1 - len(passes))]
            passes[k].setdefault(node, []).append((st, c))
    return passes


def _fleet_work(fleet, part: dict) -> dict:
    """Before a later pass: its steps on nodes an earlier pass failed are skipped; the
    fleet-level work of the pass's first steps runs once per key over the nodes still usable."""
    usable = {s.name for s in fleet.usable()}
    for node in [n for n in part if n not in usable]:
        for st, _c in part[node]:
            fleet.sessions[node].result.add_step(StepResult(f"{st.role}: {st.name}", "skipped",
                                                            "an earlier step failed"))
    part = {n: items for n, items in part.items() if n in usable}
    work: dict[str, tuple] = {}
    for node, items in part.items():
        key, fn = items[0][0].fleet
        work.setdefault(key, (fn, []))[1].append(node)
    for fn, nodes in work.values():
        fn(fleet, nodes)
    return part


class Waves:
    """The plan-and-apply of one provision over the fleet: the nodes that act for every group
    they are in go first; the nodes that share a home or a machine with one of them follow
    (re-probed where the node acting for them changed something) and only verify the shared
    steps."""

    def __init__(self, fleet, roles, prov: rolemod.Provisioning, check: bool, planned: dict | None = None):
        self.fleet, self.roles, self.prov, self.check = fleet, roles, prov, check
        self.plans: dict[str, list[Step]] = {}
        self.planned = dict(planned or {})      # node -> (facts, steps) planned before the waves
        self.differ: dict = {}
        self.topo = prov.topology

    def _plan(self, s):
        facts = self.prov.facts[s.name]
        early, steps = self.planned.pop(s.name, (None, None))
        if early is not facts:       # planned from facts read again since: plan anew
            steps = _plan_node(rolemod.Ctx(s.host, self.prov), self.roles)
        self.plans[s.name] = steps
        return _check_all(s, steps, facts, self.check, lambda st: self.topo.actor(s.name, st.scope))

    def wave(self, nodes: list[str]) -> None:
        differ = self.fleet.map(self._plan, "plan", only=nodes)
        self.differ.update(differ)
        if not self.check:
            redact = self.redactor()
            for k, part in enumerate(_passes(differ)):   # one pass unless a step waits (Step.fleet)
                if k and part:
                    part = _fleet_work(self.fleet, part)
                # only the nodes with something to apply: a converged node has no apply stage
                self.fleet.map(lambda s: _apply(s, part[s.name], self.prov.facts[s.name], redact),
                               "apply", only=list(part))

    def redactor(self) -> Redactor:
        return _redactor(self.prov, [st for p in self.plans.values() for st in p])

    def all(self, order: list[str]) -> None:
        """Wave after wave: a node goes once the nodes that act for its home and its machine
        went (an actor is the first of its group in inventory order, so this always ends);
        one whose actor changed something reads its facts again first."""
        done: set[str] = set()
        pending = list(order)
        while pending:
            wave = [n for n in pending if all(a in done or a == n for a in self._actors(n))]
            acted = {n for n, d in self.differ.items() if d}
            stale = [n for n in wave if n not in self.plans and set(self._actors(n)) & acted - {n}]
            if stale and not self.check:     # what they share changed: read it again
                self.prov.facts.update(self.fleet.map(lambda s: _probe(s, self.roles, self.prov),
                                                      "facts", only=stale))
            self.wave(wave)
            done.update(wave)
            pending = [n for n in pending if n not in done]

    def _actors(self, node: str) -> list[str]:
        return [self.topo.actor(node, "home"), self.topo.actor(node, "machine")]


def _platform_mix(prov: rolemod.Provisioning) -> None:
    """Nodes sharing a home must share a venv path only if they share a platform."""
    for nodes in prov.topology.homes.values():
        by_path: dict[str, set] = {}
        for n in nodes:
            f, v = prov.facts.get(n) or {}, prov.vars[n]
            py = f.get(factmod.PYTHON) or {}
            plat = ((f.get(factmod.OS) or {}).get("arch"), py.get("version", "")[:4], py.get("glibc"))
            by_path.setdefault(v["venv_path"], set()).add(plat)
        for path, plats in by_path.items():
            if len(plats) > 1:
                raise InputError(f"{fold(nodes)} share one home but not a platform "
                                 f"({'; '.join(sorted(' '.join(map(str, p)) for p in plats))}): one venv at "
                                 f"{path} cannot serve them all",
                                 hint="give each platform group its own venv_path in group_vars "
                                      "(e.g. group_vars/aarch64.yml: venv_path: ~/.nodeprep/venv-aarch64)")


def _locks(fleet, prov: rolemod.Provisioning) -> Locks:
    """One lock per home and one per machine, each taken on the node that acts for it."""
    topo, out = prov.topology, []
    for nodes in topo.homes.values():
        out.append(Lock(nodes[0], HOME_LOCK, f"home of {fold(nodes)}"))
    for key, nodes in topo.machines.items():
        uid = ((prov.facts.get(nodes[0]) or {}).get(factmod.USER) or {}).get("uid", "x")
        tag = hashlib.sha256(key.encode()).hexdigest()[:12]
        out.append(Lock(nodes[0], f"/tmp/nodeprep-{uid}-{tag}.lock", f"machine of {fold(nodes)}"))
    return Locks(fleet, out, Owner.me(fleet.run_id))


def _converged(prov: rolemod.Provisioning, roles, planned: dict) -> bool:
    """Whether every step of every probed node already matches the probe's facts. A run that
    would change nothing takes no lock (two round trips per node saved: its cost is the probe);
    one that would, or that cannot tell from the probe alone, takes the locks and goes the
    whole way. PLANNED gets each node's steps with the facts they were planned from."""
    hosts = {h.name: h for h in prov.hosts}
    for name, facts in prov.facts.items():
        try:
            steps = _plan_node(rolemod.Ctx(hosts[name], prov), roles)
            planned[name] = (facts, steps)
            if not all(all(r in facts for r in st.reads) and st.check(facts).ok for st in steps):
                return False
        except Exception:      # the waves plan it again and report why, under the locks
            return False
    return True


def validated(opts: ProvisionOptions, settings: Settings, events: Events):
    """(roles, prov): the inventory read and every role's `validate` passed; InputError
    otherwise, and no node touched yet."""
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, parse_sets(opts.sets), events)
    roles = rolemod.load(opts.roles, settings.roles_dir)
    prov = rolemod.Provisioning(inv, hosts, settings, opts.check, events=events)
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
        prov.facts = fleet.map(lambda s: _probe(s, roles, prov), "facts")
        prov.topology = Topology.of(prov.facts, order)
        _platform_mix(prov)
        for line in prov.topology.describe():
            events.log(line)
            prov.notes.append(line)
        locks = None
        try:
            controller = [res for role in roles for res in (role.call("controller", prov) or [])]
            planned: dict = {}
            converged = not opts.check and _converged(prov, roles, planned)
            if not opts.check and not converged:
                locks = _locks(fleet, prov)
                if locks.acquire(settings.lock_wait, settings.lock_stale):
                    # another run held the lock: the nodes may have changed since the probe
                    prov.facts = fleet.map(lambda s: _probe(s, roles, prov), "facts")
            # a converged fleet's plans stand (nothing will change, nothing is read again);
            # otherwise a node's plan may read what another node's actions change
            waves = Waves(fleet, roles, prov, opts.check, planned if converged else None)
            waves.all(order)
            for s in fleet.usable():
                ctx = rolemod.Ctx(s.host, prov)
                for role in roles:
                    s.result.data.update(role.call("report", ctx) or {})
        finally:
            if locks:
                locks.release()
        report = fleet.report(inventory=inv.name, check=opts.check,
                              controller=[c.as_dict() for c in controller], notes=prov.notes)
    redact = waves.redactor()
    return ProvisionResult(report, opts.check, controller, prov.notes,
                           _diffs(waves.differ, redact) if opts.diff else [], redact)
