"""A training job made ready to run: one probe per node, the LaunchPlan built once from what it
found (ops/train/launchplan.py), preflight (preflight.py), and the job directory and agent
synced to the same absolute path on every node (once per shared home)."""

from __future__ import annotations

import secrets
import shlex
import time

from nodeprep.commands.common import container_images, container_specs
from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train import gate, preflight
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.facts.modules import with_modules
from nodeprep.errors import InputError, NodeprepError
from nodeprep.inventory import dsfilter
from nodeprep.ops.container import readiness
from nodeprep.ops.provision.topology import Topology
from nodeprep.ops.sync import chained, push
from nodeprep.ops.train import emulate, gpusplit, incontainer, payload
from nodeprep.ops.train.launchplan import LaunchPlan, Prepared, Split, node_runs


def new_job_id() -> str:
    """Job ids start with their start time: runs sort by age (train.status, train.logs)."""
    return time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(3)


def _probe(s, v: dict, hosts, opts: TrainOptions, spec=None):
    """One probe per node; a node that may become the head (the first, or any under
    --exclude-unhealthy) also reads the head's files and port. SPEC: its ContainerSpec on the
    container way (the engine and images instead of the venv)."""
    venv = v["venv_path"]
    reqs = [
        factmod.USER,
        factmod.GPUS,
        factmod.INTERFACES,
        factmod.IDENTITY,
        factmod.JOB_PROCESSES,
        factmod.GPU_APPS,
        factmod.PROGRAMS,
    ]
    if spec is None:
        reqs += [factmod.VENV(venv), factmod.TORCH_BUILD(factmod.TorchIn(venv))]
        if v.get("modules"):  # what the named ones resolve to, what the ranks' shells have
            reqs += [factmod.MODULES, factmod.RANK_MODULES]
    else:
        reqs += [factmod.CONTAINER(readiness.engines(spec.engine)), factmod.RDMA_PORTS]
    if opts.health_gate:
        have = {factmod.key_of(r) for r in reqs}
        reqs += [r for r in gate.requests(hosts) if factmod.key_of(r) not in have]
    if s.name == hosts[0].name or (opts.health_gate and opts.exclude_unhealthy):
        reqs.append(factmod.PORT_LISTENING(opts.port))
        if opts.launcher == "deepspeed" and spec is None:
            reqs += [factmod.FILE("~/.deepspeed_env"), factmod.FILE(v["env_file"])]
    return factmod.gather(s, reqs, v)


def _container_way(opts: TrainOptions, hosts, vars_of: dict) -> dict:
    """node -> its ContainerSpec when the ranks run in containers (--container, or the
    inventory names an image and --no-container is not given); {} on the venv way."""
    specs = container_specs(hosts, vars_of)
    use = opts.container if opts.container is not None else any(specs.values())
    if not use:
        return {}
    if opts.emulate:
        raise InputError(
            "--emulate runs the ranks on the one machine's venv, not in containers",
            hint="add --no-container, or train on real nodes",
        )
    if not any(specs.values()):
        raise InputError(
            "--container: the inventory names no container_image",
            hint="set container_image (docs/containers.md) and run `invoke provision`",
        )
    return {h.name: specs[h.name] for h in hosts}


def fail_if_nodes_failed(fleet) -> None:
    bad = fleet.unusable()
    if bad:
        raise NodeprepError(
            "cannot start the job: " + "; ".join(f"{n}: {m}" for n, m in bad.items())
        )


def _emulation(opts: TrainOptions, fleet, head, facts: dict, events: Events):
    """--emulate M: the one machine's ssh aliases written, the split planned."""
    if not opts.emulate:
        return None
    emu = emulate.emulation_of(
        head,
        opts.emulate,
        facts[head.name][factmod.GPUS]["count"],
        opts.launcher,
        opts.emulate_network,
    )
    fleet.map(lambda s: emulate.write_aliases(s, emu, head), "emulate")
    fail_if_nodes_failed(fleet)
    events.note(head.name, emu.describe())
    return emu


def plan_of(
    opts: TrainOptions, job_id: str, hosts, facts: dict, vars_of: dict, emu=None
) -> tuple[LaunchPlan, Topology]:
    """The LaunchPlan from the probe's FACTS (pure: the unit tests build plans this way)."""
    root, script = payload.resolve_payload(opts.payload)
    names = [h.name for h in hosts]
    topo = Topology.of(facts, names)
    shares = gpusplit.machine_shares(
        topo.by_machine_id, names, {n: facts[n][factmod.GPUS]["count"] for n in names}
    )
    rel = script.name if script.parent == root else str(script.relative_to(root))
    chosen = dsfilter.parse(opts.limit) if dsfilter.is_filter(opts.limit) else None  # NAME:SLOTS
    plan = LaunchPlan(
        job_id,
        opts.launcher,
        rel,
        node_runs(hosts, facts, vars_of, root.name, Split(topo.by_machine_id, shares, chosen)),
        args=tuple(opts.args),
        ds_launcher=opts.ds_launcher,
        port=opts.port,
        max_restarts=opts.max_restarts,
        shares=shares,
        emu=emu,
    )
    return plan, topo


def prepare(
    opts: TrainOptions, inv, hosts, fleet, events: Events, job_id: str | None = None
) -> Prepared:
    """Facts, the plan, preflight and the job directory's sync; raises NodeprepError listing
    what blocks the launch (unless --no-preflight)."""
    if opts.emulate:
        emulate.check_emulate(opts.emulate, hosts, opts.launcher)
    root, script = payload.resolve_payload(opts.payload)
    files = payload.local_files(root, script)
    vars_of = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
    specs = _container_way(opts, hosts, vars_of)
    windows: dict[str, tuple[float, float]] = {}

    def probe(s):
        t0 = time.time()
        got = _probe(s, vars_of[s.name], hosts, opts, specs.get(s.name))
        windows[s.name] = (t0, time.time())  # the controller's clock around it
        return got

    facts = fleet.map(probe, "facts")
    fail_if_nodes_failed(fleet)
    kept = gate.apply(opts, hosts, facts, windows, events)
    left_out = tuple(h.name for h in hosts if h not in kept)
    hosts = kept
    facts = {h.name: facts[h.name] for h in hosts}
    emu = _emulation(opts, fleet, hosts[0], facts, events)
    plan, topo = plan_of(opts, job_id or new_job_id(), hosts, facts, vars_of, emu)
    boxes: list[str] = []
    if specs:
        jc, boxes = incontainer.job_containers(
            plan.nodes,
            plan.job_id,
            facts,
            specs,
            container_images(hosts, vars_of, fleet.settings.state),
        )
        plan = plan.in_containers(jc)
    prep = Prepared(
        plan,
        facts,
        vars_of,
        files=files,
        topo=topo,
        container_problems=tuple(boxes),
        left_out=left_out,
    )
    if prep.container_problems and not opts.preflight:  # no container: nothing could run
        raise NodeprepError(
            "cannot run in containers:\n  " + "\n  ".join(prep.container_problems),
            hint="fix these (even --no-preflight needs a container on every node)",
        )
    problems = preflight.problems(prep, opts, fleet)
    if problems and opts.preflight:
        raise NodeprepError(
            "preflight failed:\n  " + "\n  ".join(problems),
            hint="fix these, or --no-preflight to launch anyway",
        )
    preflight.stale(prep, fleet, opts.kill_stale, events)
    _sync(prep, fleet, events, opts.dry_run)
    return prep


def _sync(prep: Prepared, fleet, events: Events, dry_run: bool) -> None:
    """The job directory and the agent, once per home: nodes sharing one (NFS) see the same.
    Only what differs moves (ops/sync/push.py); --dry-run says what would."""
    plan = prep.plan

    def python(node: str, args: str) -> str:  # the node's interpreter, its modules loaded
        v = prep.vars[node]
        return with_modules(v, f"{shlex.quote(str(v.get('python') or 'python3'))} {args}")

    how = push.How(python=python, dry_run=dry_run)
    homes = [ns[0] for ns in prep.topo.homes.values()]
    agent = payload.agent_files()
    try:
        fanned = chained.FannedOut({})  # homes fed one stream node to node where it helps
        if not dry_run and all(prep.vars[n].get("ssh_mesh") for n in homes):
            fanned = chained.fan_out(fleet, homes, prep.files, lambda n: plan.node(n).job_dir, how)
        pushed = fleet.map(
            lambda s: (
                payload.sync(s, prep.files, plan.node(s.name).job_dir, how, fanned.look(s.name)),
                payload.sync(s, agent, payload.agent_dir(plan.node(s.name).home), how),
            ),
            "sync",
            only=homes,
        )
    finally:
        how.close()
    fail_if_nodes_failed(fleet)
    chain = fanned.chained
    pushed = {  # a node its chain filled: what the chain brought it
        n: (chain[n] if n in chain and not (a.sent or a.deleted) else a, b)
        for n, (a, b) in pushed.items()
    }
    sent = sum(len(a.sent) + len(b.sent) for a, b in pushed.values())
    gone = sum(len(a.deleted) for a, _b in pushed.values())
    size = sum(a.nbytes + b.nbytes for a, b in pushed.values())
    events.note(
        plan.head.name,
        f"job {plan.job_id}: {sent} file(s) ({size / 1e6:.1f} MB) "
        + ("would be " if dry_run else "")
        + f"pushed to {plan.head.job_dir} on {len(plan.nodes)} node(s)"
        + (f", {gone} deleted" if gone else "")
        + (f" ({len(homes)} home(s))" if len(homes) < len(plan.nodes) else ""),
    )
    if dry_run:
        for node, (a, _b) in pushed.items():
            for rel in a.sent[:20]:
                events.note(node, f"would send {rel}")
            if len(a.sent) > 20:
                events.note(node, f"would send {len(a.sent) - 20} more")
            for rel in a.deleted:
                events.note(node, f"would delete {rel}")
