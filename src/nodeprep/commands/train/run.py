"""`invoke train`: prepare the job (prepare.py: the probe, the LaunchPlan, preflight, the sync),
turn the plan into the supervisor's RunSpec, and run it to its end under the supervisor
(supervise.py), attached or detached; --dry-run shows the commands instead. With --restarts N
a failed attempt is classed (ops/train/causes.py) and, where ops/train/restarts.py says so,
relaunched without the node it blames (quarantined: ops/train/quarantine.py)."""

from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train.prepare import new_job_id, prepare
from nodeprep.commands.train.runspec import Outcome, RunSpec, redacted_env
from nodeprep.commands.train.supervise import WATCH_VAR, Supervisor
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.results import RunLog
from nodeprep.errors import NodeprepError
from nodeprep.ops.container.run import shell as container_shell
from nodeprep.ops.train import causes, quarantine, restarts, rundir
from nodeprep.ops.train.launchplan import Prepared
from nodeprep.ops.train.payload import agent_dir
from nodeprep.settings import Settings


@dataclass
class TrainResult:
    job_id: str
    where: str  # "2 node(s)", "2 emulated node(s) on worker-0"
    outcome: Outcome = field(default_factory=Outcome)
    commands: dict = field(default_factory=dict)  # --dry-run and srun: node -> its command
    launched: bool = True
    run_dir: str = ""
    detached: bool = False  # the supervisor runs on in the background
    nodes: list[str] = field(default_factory=list)  # the nodes it launched on
    attempts: list[dict] = field(default_factory=list)  # --restarts: each attempt, in order
    stop_reason: str = ""  # --restarts: why no further attempt was made

    @property
    def failure(self) -> str | None:
        return self.outcome.failure

    @property
    def exit_code(self) -> int:
        if self.outcome.failure is None and not self.outcome.leftovers:
            return 0
        return (
            130
            if self.outcome.state == "stopped"
            and (self.outcome.root or {}).get("kind") == "interrupted"
            else 1
        )


def run_spec(prep: Prepared, opts: TrainOptions) -> RunSpec:
    """What the supervisor needs (saved as the run's job.json): the plan's commands, one
    watcher per machine, the rank layout, the versions and environment (secrets redacted)."""
    plan = prep.plan
    cmds = plan.commands()
    if plan.launcher == "torchrun":  # torchrun's ranks say their node themselves
        cmds = {
            label: f"export NODEPREP_NODE={shlex.quote(label)}; " + cmd
            for label, cmd in cmds.items()
        }
    names = [n.name for n in plan.nodes]
    versions = {
        n.name: {
            k: (
                prep.facts[n.name].get(
                    factmod.TORCH_BUILD(factmod.TorchIn(prep.vars[n.name]["venv_path"]))
                )
                or {}
            ).get(k)
            for k in ("version", "cuda", "nccl")
        }
        for n in plan.nodes
    }
    head_vars = prep.vars[plan.head.name]
    env = {
        **plan.env(),
        "MASTER_PORT": plan.port,
        **(head_vars.get("deepspeed_env") or {}),
        **(head_vars.get("nccl_env") or {}),
    }
    return RunSpec(
        plan.job_id,
        plan.launcher,
        plan.where(),
        inventory=opts.inventory,
        limit=opts.limit,
        nodes=names,
        commands={label: [plan.session_of(label), cmd] for label, cmd in cmds.items()},
        watchers={m: [plan.node(m).python, agent_dir(plan.node(m).home)] for m in plan.machines()},
        layout=plan.layout(),
        names=sorted(set(names) | set(plan.emu.names if plan.emu else [])),
        restarts=plan.launcher == "torchrun" and plan.max_restarts > 0,
        hang_timeout=opts.hang_timeout,
        timeout=opts.timeout,
        ranks_shown=list(opts.ranks) if opts.ranks is not None else None,
        machine_of={n.name: n.machine for n in plan.nodes},
        versions=versions,
        env=redacted_env(env),
        containers=containers_of(plan),
        addresses={n.address: n.name for n in plan.nodes},
    )


def containers_of(plan) -> dict:
    """node -> the sh that starts, removes and finds its job container, and the exec prefix
    the watcher and the stack dumps run under (the container way; {} on the venv way)."""
    jc = plan.containers
    if jc is None:
        return {}
    return {
        n.name: {
            "start": jc.start(n.name),
            "remove": jc.remove(n.name),
            "left": jc.leftovers(n.name),
            "inside": container_shell(jc.exec_argv(n.name, (WATCH_VAR,))),
        }
        for n in plan.nodes
    }


def shown(plan) -> dict[str, str]:
    """--dry-run: every command, each node's container start first on the container way."""
    starts = {f"{n} (container)": c["start"] for n, c in containers_of(plan).items()}
    return {**starts, **plan.commands()}


def _check_slurm(fleet, head: str) -> None:
    r = fleet.sessions[head].run(
        "command -v srun >/dev/null 2>&1 || exit 3; sinfo -h -o %D", label="srun?"
    )
    if r.rc == 3:
        raise NodeprepError(
            f"srun not found on {head}: no Slurm here; the "
            "command above is what would run inside an allocation"
        )
    if r.rc != 0:
        raise NodeprepError(
            f"Slurm is not usable from {head}: {r.tail(1) or 'sinfo failed'}",
            hint="the command above is what would run; on the lab: `invoke lab.up --slurm`",
        )


def supervise(spec: RunSpec, fleet, events: Events, path) -> Outcome:
    """Run and watch a prepared job to its end (attached, or in the detached supervisor)."""
    files = rundir.RunDir(path)
    try:
        return Supervisor(spec, fleet, events, files).run()
    finally:
        files.close()


def train(opts: TrainOptions, settings: Settings, events: Events) -> TrainResult:
    """The srun command is shown before it runs (events.note), as --dry-run shows every one.
    --detach: prepare here, then the cli starts the supervisor in the background. Quarantined
    nodes are left out, with a note saying how to release them."""
    opts.validate()
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    hosts = _not_quarantined(hosts, settings, events)
    if not opts.restarts:
        return _attempt(opts, settings, events, inv, hosts)
    return _with_restarts(opts, settings, events, inv, hosts)


def _not_quarantined(hosts, settings: Settings, events: Events) -> list:
    held = quarantine.load(settings.state)
    out = [h for h in hosts if h.name not in held]
    for h in hosts:
        if h.name in held:
            events.note(
                h.name,
                f"left out: {quarantine.line(h.name, held[h.name])}; "
                f"`invoke train.release --node {h.name}` puts it back",
            )
    if not out:
        raise NodeprepError(
            "every selected node is quarantined",
            hint="`invoke train.release --node NODE` (or --all) once they are fixed",
        )
    return out


def _attempt(opts, settings, events, inv, hosts, restart: int = 0) -> TrainResult:
    """One launch on HOSTS to its end; RESTART: its attempt past the first (the ranks' env).
    --min-nodes: the fewest nodes it may launch on once the health gate has spoken."""
    job_id = new_job_id()
    path = rundir.run_path(settings.runs, job_id)
    path.mkdir(parents=True, exist_ok=True)
    with Fleet(hosts, settings, "train", events, runlog=RunLog(path)) as fleet:
        prep = prepare(opts, inv, hosts, fleet, events, job_id)
        prep.plan = dataclasses.replace(prep.plan, restart=restart)
        where, names = prep.plan.where(), [n.name for n in prep.plan.nodes]
        if len(names) < (opts.min_nodes or 0):
            raise NodeprepError(
                f"{len(names)} node(s) passed the health gate, --min-nodes {opts.min_nodes}"
            )
        if opts.dry_run:
            return TrainResult(
                job_id, where, commands=shown(prep.plan), launched=False, run_dir=str(path)
            )
        spec = run_spec(prep, opts)
        cmds = {label: cmd for label, (_node, cmd) in spec.commands.items()}
        if opts.launcher == "srun":
            for node, cmd in cmds.items():
                events.note(node, cmd)
            _check_slurm(fleet, prep.plan.head.name)
        if opts.detach:
            rundir.RunDir(path).write_json("job.json", asdict(spec))
            return TrainResult(job_id, where, commands=cmds, run_dir=str(path), detached=True)
        outcome = supervise(spec, fleet, events, path)
        return TrainResult(
            job_id,
            where,
            outcome,
            cmds if opts.launcher == "srun" else {},
            run_dir=str(path),
            nodes=names,
        )


def _with_restarts(opts: TrainOptions, settings, events, inv, hosts) -> TrainResult:
    """Attempts until one finishes, or restarts.decide stops the job; each failed attempt's
    blamed node, and each node the health gate left out of a relaunch, quarantined."""
    need = opts.min_nodes or len(hosts)
    retry_on = frozenset(opts.retry_on) or causes.RETRIED
    attempts: list[dict] = []
    cur, cur_opts, k = hosts, opts, 1
    while True:
        res = _attempt(cur_opts, settings, events, inv, cur, k - 1)
        held = {h.name: "left out by the health gate" for h in cur if h.name not in res.nodes}
        c = res.outcome.cause
        cause = causes.Cause(c["klass"], c["node"], c["why"]) if c else None
        d = restarts.decide(cause, k, opts.restarts, res.nodes, retry_on=retry_on, min_nodes=need)
        held.update(d.quarantine)
        for node, why in held.items():
            quarantine.add(settings.state, node, why, res.job_id)
        attempts.append(
            {
                "attempt": k,
                "job_id": res.job_id,
                "nodes": res.nodes,
                "failure": res.failure,
                "cause": c,
                "quarantined": held,
                "relaunch": d.relaunch,
            }
        )
        rundir.RunDir(Path(res.run_dir)).write_json("attempts.json", attempts)
        if not d.relaunch:
            res.attempts, res.stop_reason = attempts, d.why
            return res
        k += 1
        wait = restarts.backoff(k)
        events.note(
            d.nodes[0],
            f"attempt {k}/{opts.restarts + 1}, {time.strftime('%H:%M:%S')}: {cause.line}"
            + (f" -> quarantined {', '.join(held)}" if held else "")
            + f"; relaunching on {', '.join(d.nodes)} in {wait:g}s",
        )
        time.sleep(wait)
        cur = [h for h in hosts if h.name in d.nodes]
        cur_opts = dataclasses.replace(
            opts,
            args=tuple(opts.args) + tuple(opts.resume_args),
            exclude_unhealthy=True,
            min_nodes=need,
        )
