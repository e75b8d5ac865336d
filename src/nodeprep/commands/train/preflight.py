"""What `train` checks before anything starts, on the LaunchPlan and the probe's facts: the plan
itself (one path for the launchers that need it, GPU shares), a venv on every node, the
master port free on the head, the launch contract (ops/train/contract.py: programs on the
non-interactive PATH, ~/.deepspeed_env as DeepSpeed reads it), the master port reachable from
every machine, the ssh mesh from the head, and processes of earlier jobs still running
(refused, or stopped with --kill-stale)."""

from __future__ import annotations

import threading

from nodeprep.commands.options import TrainOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.errors import NodeprepError
from nodeprep.inventory.nodeset import fold
from nodeprep.ops.launchenv import dsenv
from nodeprep.ops.ssh.logins import mesh_script, parse_mesh
from nodeprep.ops.train import contract, processes
from nodeprep.ops.train.launchplan import LaunchPlan, Prepared


def problems(prep: Prepared, opts: TrainOptions, fleet) -> list[str]:
    """Everything that blocks the launch, one line each, naming the node and the fix. Without
    --no-preflight the ones that need a round trip (port, mesh) run too."""
    plan, facts = prep.plan, prep.facts
    out = plan.path_problems() + list(prep.container_problems)
    for n in [] if plan.containers else plan.nodes:  # the container way: the image's Python
        venv = prep.vars[n.name]["venv_path"]
        if not facts[n.name][factmod.VENV(venv)]["exists"]:
            out.append(f"{n.name}: no venv at {venv} (run `invoke provision`)")
    if facts[plan.head.name].get(factmod.PORT_LISTENING(plan.port)):
        out.append(f"{plan.head.name}: master port {plan.port} is already in use (--port)")
    if opts.preflight:
        out += contract_problems(prep)
        out += _on_the_nodes(plan, fleet, port=not out)
    return out + plan.share_problems()


def _on_the_nodes(plan: LaunchPlan, fleet, port: bool) -> list[str]:
    """The checks that need round trips, side by side: the ssh mesh from the head (deepspeed,
    mpirun) in a thread while the master port is tried (when nothing else blocks the launch).
    Under a Slurm transport (--via slurm) one after the other: its stages are batches."""
    mesh: list = []
    # DeepSpeed in containers starts each node's part itself (--no_ssh): no logins
    if plan.launcher not in ("deepspeed", "mpirun") or (
        plan.containers and plan.launcher != "mpirun"
    ):
        return port_problems(plan, fleet) if port else []
    if not port or fleet.transport is not None:
        return (port_problems(plan, fleet) if port else []) + mesh_problems(plan, fleet)

    def meshed():
        try:
            mesh.append(mesh_problems(plan, fleet))
        except BaseException as e:  # raised here, in the main thread, as if called from it
            mesh.append(e)

    # a daemon thread: a Ctrl-C here is not held up until the mesh's logins end
    t = threading.Thread(target=meshed, daemon=True)
    t.start()
    out = port_problems(plan, fleet)
    t.join()
    if isinstance(mesh[0], BaseException):
        raise mesh[0]
    return out + mesh[0]


def contract_problems(prep: Prepared) -> list[str]:
    """ops/train/contract.py: programs on the non-interactive PATH, ~/.deepspeed_env."""
    plan, got = prep.plan, prep.facts
    head = plan.head.name
    if plan.containers and plan.launcher in ("deepspeed", "torchrun"):
        return []  # the launcher is the image's; the engine was checked (container_problems)
    out = contract.missing_programs(
        plan.launcher,
        plan.ds_launcher,
        {n.name: got[n.name][factmod.PROGRAMS] for n in plan.nodes},
        head,
    )
    if not plan.containers:
        want = {}  # what the named modules resolve to (cuda/12.6 may load cuda/12.6.3)
        for n in plan.nodes:
            names = prep.vars[n.name].get("modules") or []
            if names:
                want[n.name] = (got[n.name].get(factmod.MODULES) or {}).get("loaded") or names
        out += contract.module_problems(
            want, {n.name: got[n.name].get(factmod.RANK_MODULES) or [] for n in plan.nodes}
        )
    if plan.launcher != "deepspeed" or plan.containers:
        return out
    out += contract.deepspeed_env_problems(
        head,
        got[head].get(factmod.FILE("~/.deepspeed_env")),
        got[head].get(factmod.FILE(prep.vars[head]["env_file"])),
        plan.ds_launcher,
        got[head][factmod.GPUS]["count"],
    )
    if plan.ds_launcher == "pdsh":
        for what, word in (
            ("the venv's python", plan.head.python),
            ("the job directory", plan.head.job_dir),
        ):
            if not dsenv.pdsh_plain(word):
                out.append(
                    f"{head}: {what} {word!r} has characters DeepSpeed's pdsh launcher "
                    f"cannot carry ({dsenv.PDSH_COMMAND}); use a venv_path and a "
                    f"payload directory named with letters, digits and _@+=:,./- only"
                )
    return out


def port_problems(plan: LaunchPlan, fleet) -> list[str]:
    """A listener on the head's master port, a connect from every other machine."""
    head = plan.head
    others = [m for m in plan.machines() if plan.node(m).machine != head.machine]
    if not others or plan.emu or plan.launcher == "srun":
        return []
    r = fleet.sessions[head.name].run(
        contract.listen_script(head.python, plan.port, accepts=len(others)),
        timeout=30,
        label="listen on the master port",
    )
    if "ready" not in r.stdout:
        return [f"{head.name}: cannot listen on port {plan.port}: {r.stdout.strip()[-200:]}"]
    got = fleet.map(
        lambda s: s.run(
            contract.connect_script(plan.node(s.name).python, plan.master_addr, plan.port),
            timeout=30,
            label="reach the master port",
        ).stdout.strip(),
        "port",
        only=others,
    )
    pid = next((ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("pid ")), "")
    reached = all(v.startswith("ok") for v in got.values()) and len(got) == len(others)
    if pid.isdigit() and not reached:  # free the port (every node connected: it is free)
        fleet.sessions[head.name].run(
            f"kill {pid} 2>/dev/null; true", timeout=10, label="stop listening"
        )
    return [
        f"{n}: cannot reach {plan.master_addr}:{plan.port} on {head.name} "
        f"({v.removeprefix('fail ')}): open the port between the nodes (firewall), or --port"
        for n, v in sorted(got.items())
        if not v.startswith("ok")
    ]


def mesh_problems(plan: LaunchPlan, fleet) -> list[str]:
    """The launcher logs in from the head to every node: try those logins for real."""
    head = fleet.sessions[plan.head.name]
    peers = plan.emu.names if plan.emu else [n.name for n in plan.nodes]
    mesh = parse_mesh(head.run(mesh_script(peers), timeout=60, label="preflight mesh").stdout)
    return [
        f"{plan.head.name} -> {p}: ssh fails (exit {rc}) {err}".rstrip()
        for p, (rc, err) in sorted(mesh.items())
        if rc != 0
    ]


def stale(prep: Prepared, fleet, kill: bool, events: Events) -> None:
    """Processes of earlier nodeprep jobs (and, on GPU nodes, any process holding a GPU)
    refuse the launch; --kill-stale (KILL) stops the earlier jobs (never other processes)."""
    found, gpu = {}, []
    for machine in prep.plan.machines():
        got = prep.facts[machine]
        for old, procs in processes.stale(got[factmod.JOB_PROCESSES], prep.job_id).items():
            found.setdefault(old, {})[machine] = procs
        gpu += [
            f"{machine}: pid {p['pid']} {p['name']} holds {p['memory']} of GPU memory"
            for p in got[factmod.GPU_APPS]
        ]
    if found and kill:
        for old, where in found.items():
            fleet.map(
                lambda s, old=old: s.run(
                    processes.cleanup_script(old), timeout=30, label="kill stale"
                ),
                "kill stale",
                only=list(where),
            )
            events.note(prep.plan.head.name, f"stopped earlier job {old} on {fold(list(where))}")
        return
    lines = [
        f"{n}: job {old} still runs pid {p['pid']}: {p['args'][:120]}"
        for old, where in found.items()
        for n, procs in where.items()
        for p in procs[:3]
    ]
    if found or gpu:
        raise NodeprepError(
            "processes of an earlier job are still running:\n  " + "\n  ".join(lines + gpu),
            hint="stop them with `invoke train.stop RUN`, or pass --kill-stale to "
            "stop earlier nodeprep jobs before this launch"
            if found
            else "stop the processes holding the GPUs",
        )
