"""The plan-and-apply of one provision (commands/provision.py runs it): each node's steps from
every role, checked against its facts (a step another node acts for, on a shared home or
machine, is only verified), the room a step needs checked before anything is written, the
differing steps applied in ONE batched command per node that re-reads their facts, and the
waves and passes that order the nodes (those that act for a shared group first) and the
fleet-level work between two steps (the wheel relay)."""

from __future__ import annotations

import secrets

from nodeprep.engine import facts as factmod
from nodeprep.engine.connect_errors import Unreachable
from nodeprep.engine.results import StepResult
from nodeprep.engine.steps import Step, action_for
from nodeprep.errors import NodeprepError
from nodeprep.ops.provision import roles as rolemod
from nodeprep.ops.provision import room
from nodeprep.redact import Redactor, secret_values


def _redactor(prov: rolemod.Provisioning, steps: list[Step]) -> Redactor:
    """Secrets are the values of secret-looking names in the environment mappings that reach
    the ranks, plus what steps declare (e.g. the cluster private key). Inventory variables such
    as `key` or `controller_key` are paths, not secrets."""
    values = [
        s
        for vs in prov.vars.values()
        for m in ("deepspeed_env", "nccl_env")
        for s in secret_values(m, vs.get(m) or {})
    ]
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
            f'echo "@@{token}:rc=$np_rc@@"'
        )
    return "\n".join(parts) + "\n" + factmod.probe_script(rereads, {}, token)


def node_steps(ctx: rolemod.Ctx, roles: list[rolemod.Role]) -> list[Step]:
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
    return StepResult(
        name,
        "failed",
        f"still differs after {actor} acted for the {where}: {c.why}"
        "; a value that differs per node cannot live in a shared file",
    )


def _check_all(session, steps: list[Step], facts: dict, check_mode: bool, actor=None):
    """Compare every step with the facts; returns [(step, StepCheck)] of those that differ and
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
            session.result.add_step(
                StepResult(
                    f"{st.role}: {st.name}", "failed", c.why + (f"; {st.hint}" if st.hint else "")
                )
            )
        else:
            differ.append((st, c))
    return _with_room(session, differ, facts, check_mode)


def _with_room(session, differ: list, facts: dict, check_mode: bool) -> list:
    """The differing steps, after the room check: a step that writes more than its file
    system can take (engine/steps.Room; ops/provision/room.py) fails here, before anything of
    the node is pushed or applied, naming the numbers; the node's other steps are not applied
    (the others nodes go on). One round trip, only for nodes with such steps."""
    wanted = [(i, st.room(facts)) for i, (st, _c) in enumerate(differ) if st.room]
    bad = {}
    if wanted:
        got = factmod.gather(session, [factmod.ROOM(r.path) for _i, r in wanted])
        bad = room.problems({r.path: got.get(factmod.ROOM(r.path)) for _i, r in wanted}, wanted)
    for i, (st, c) in enumerate(differ):
        if i in bad:
            session.result.add_step(StepResult(f"{st.role}: {st.name}", "failed", bad[i]))
        elif check_mode:
            session.result.add_step(
                StepResult(f"{st.role}: {st.name}", "changed", "would change: " + c.why)
            )
    return [d for i, d in enumerate(differ) if i not in bad]


def _cause(session, st: Step, facts: dict, said: str) -> str:
    """SAID (why a step failed), or the reason its room gives when the node has none left:
    one probe of the file system it writes to."""
    if st.room is None:
        return said
    try:
        r = st.room(facts)
        why = room.problem(
            factmod.gather(session, [factmod.ROOM(r.path)])[factmod.ROOM(r.path)], [r]
        )
    except (NodeprepError, KeyError, ValueError):
        return said
    return f"{why} ({said})" if why else said


def _apply(session, differ, facts: dict, redact: Redactor) -> None:
    if session.result.status == "failed":  # a step nodeprep cannot fix already failed
        for st, _c in differ:
            session.result.add_step(
                StepResult(
                    f"{st.role}: {st.name}", "skipped", "not applied: an earlier step failed"
                )
            )
        return
    for i, (st, _c) in enumerate(differ):
        if st.before is None:
            continue
        session.events.status(session.name, "apply", "running", f"upload for {st.role}: {st.name}")
        try:
            with session.busy(f"upload for {st.role}: {st.name}"):
                st.before(session, facts)
        except (OSError, NodeprepError) as e:  # an upload failed: nothing after it runs
            if isinstance(e, Unreachable) or session.silent():
                raise
            session.result.add_step(
                StepResult(f"{st.role}: {st.name}", "failed", _cause(session, st, facts, str(e)))
            )
            for later, _ in differ[i + 1 :]:
                session.result.add_step(
                    StepResult(f"{later.role}: {later.name}", "skipped", "an earlier step failed")
                )
            differ = differ[:i]
            break
    if not differ:
        return
    token = secrets.token_hex(6)
    changes, view = [], factmod.FactValues(facts)
    for st, _c in differ:  # each action planned on the node as the earlier ones leave it
        changes.append((st, action_for(st, view)))
        if st.after:
            view.update(st.after(view))
    rereads = list(dict.fromkeys(r for st, _c in differ for r in st.reads))
    names = [f"{st.role}: {st.name}" for st, _ in changes]
    marks = {f"@@{token}:a{i}@@": i for i in range(len(changes))}

    def progress(line: str):  # the live display shows the step the node is in now
        i = marks.get(line)
        if i is not None:
            session.events.status(
                session.name, "apply", "running", f"step {i + 1}/{len(names)}: {names[i]}"
            )

    r = session.run(
        apply_script(changes, rereads, token),
        label=f"apply {len(changes)} step(s): " + ", ".join(s.name for s, _ in changes)[:250],
        log_output=False,
        on_line=progress,
    )
    sections = factmod.split_sections(r.stdout, token)
    after = facts  # updated in place: reports and later stages see the node as it is now
    if all(t in sections for t in factmod.section_tags(rereads)):
        after.update(factmod.parse_sections(session.name, rereads, r.stdout, token, r.rc))
    _record(session, differ, sections, r, after, redact)


def probe(s, roles, prov) -> factmod.FactValues:
    ctx = rolemod.Ctx(s.host, prov)
    reqs = [factmod.HOSTNAME, factmod.IDENTITY] + [f for r in roles for f in r.facts()]
    reqs += [q for r in roles for q in r.reads(ctx)]
    return factmod.gather(s, list(dict.fromkeys(reqs)), prov.vars[s.name])


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
            fleet.sessions[node].result.add_step(
                StepResult(f"{st.role}: {st.name}", "skipped", "an earlier step failed")
            )
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

    def __init__(
        self, fleet, roles, prov: rolemod.Provisioning, check_mode: bool, early: dict | None = None
    ):
        self.fleet = fleet
        self.roles = roles
        self.prov = prov
        self.check_mode = check_mode
        self.steps: dict[str, list[Step]] = {}
        self.early = dict(early or {})  # node -> (facts, steps) planned before the waves
        self.differ: dict = {}
        self.topo = prov.topology

    def _check_node(self, s):
        facts = self.prov.facts[s.name]
        early, steps = self.early.pop(s.name, (None, None))
        if early is not facts:  # planned from facts read again since: plan anew
            steps = node_steps(rolemod.Ctx(s.host, self.prov), self.roles)
        self.steps[s.name] = steps
        return _check_all(
            s, steps, facts, self.check_mode, lambda st: self.topo.actor(s.name, st.scope)
        )

    def wave(self, nodes: list[str]) -> None:
        differ = self.fleet.map(self._check_node, "plan", only=nodes)
        self.differ.update(differ)
        if not self.check_mode:
            redact = self.redactor()
            for k, part in enumerate(_passes(differ)):  # one pass unless a step waits (Step.fleet)
                if k and part:
                    part = _fleet_work(self.fleet, part)
                # only the nodes with something to apply: a converged node has no apply stage
                self.fleet.map(
                    lambda s: _apply(s, part[s.name], self.prov.facts[s.name], redact),
                    "apply",
                    only=list(part),
                )

    def redactor(self) -> Redactor:
        return _redactor(self.prov, [st for p in self.steps.values() for st in p])

    def all(self, order: list[str]) -> None:
        """Wave after wave: a node goes once the nodes that act for its home and its machine
        went (an actor is the first of its group in inventory order, so this always ends);
        one whose actor changed something reads its facts again first."""
        done: set[str] = set()
        pending = list(order)
        while pending:
            wave = [n for n in pending if all(a in done or a == n for a in self._actors(n))]
            acted = {n for n, d in self.differ.items() if d}
            stale = [n for n in wave if n not in self.steps and set(self._actors(n)) & acted - {n}]
            if stale and not self.check_mode:  # what they share changed: read it again
                self.prov.facts.update(
                    self.fleet.map(lambda s: probe(s, self.roles, self.prov), "facts", only=stale)
                )
            self.wave(wave)
            done.update(wave)
            pending = [n for n in pending if n not in done]

    def _actors(self, node: str) -> list[str]:
        return [self.topo.actor(node, "home"), self.topo.actor(node, "machine")]


def _record(session, differ: list, sections: dict, r, after: dict, redact: Redactor) -> None:
    """Each applied step's result from its section of the batched command's output R, checked
    again against the facts re-read in the same round trip (AFTER)."""
    for i, (st, c) in enumerate(differ):
        label = f"{st.role}: {st.name}"
        out, rc = sections.get(f"a{i}", ("", None))
        if rc is None:
            session.result.add_step(
                StepResult(label, "failed", f"no result (exit {r.rc})"), redact(r.tail())
            )
        elif out.strip() == "@@skipped@@":
            session.result.add_step(StepResult(label, "skipped", "an earlier step failed"))
        elif rc != 0:
            tail = "\n".join(out.strip().splitlines()[-12:])
            said = f"exit {rc}" + (f"; {st.hint}" if st.hint else "")
            session.result.add_step(
                StepResult(label, "failed", _cause(session, st, after, said)), redact(tail)
            )
        else:
            again = st.check(after)
            status, msg = (
                ("changed", c.why)
                if again.ok
                else ("failed", f"still differs after applying: {again.why}")
            )
            session.result.add_step(StepResult(label, status, msg))
