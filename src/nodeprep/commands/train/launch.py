"""One launch of a prepared job (prepare.py prepares it): the plan turned into the supervisor's
RunSpec (the run's job.json), --dry-run's commands, and the run under the supervisor
(supervise.py) to its end. `invoke train` (run.py) and verify --collective launch this way."""

from __future__ import annotations

import shlex

from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train.runspec import Outcome, RunSpec, redacted_env
from nodeprep.commands.train.supervise import WATCH_VAR, Supervisor
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.errors import NodeprepError
from nodeprep.ops.container.run import shell as container_shell
from nodeprep.ops.train import rundir
from nodeprep.ops.train.launchplan import Prepared
from nodeprep.ops.train.payload import agent_dir


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


def check_slurm(fleet, head: str) -> None:
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
