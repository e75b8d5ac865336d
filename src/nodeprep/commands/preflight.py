"""What `train` checks before anything starts (commands/train.Job.prepare calls these): the
launch contract (ops/train/contract.py: programs on the non-interactive PATH, ~/.deepspeed_env, the
master port reachable from every node), the ssh mesh from the head, and processes of earlier
jobs still running (refused, or stopped with --kill-stale)."""
from __future__ import annotations

from nodeprep.engine import facts as factmod
from nodeprep.errors import NodeprepError
from nodeprep.inventory.nodeset import fold
from nodeprep.ops.train import contract
from nodeprep.ops.launchenv import dsenv
from nodeprep.ops.train import jobs
from nodeprep.ops.ssh.logins import mesh_script, parse_mesh


def contract_problems(job, got: dict, names: list[str]) -> list[str]:
    """ops/train/contract.py: programs on the non-interactive PATH, ~/.deepspeed_env."""
    head, opts = job.head.name, job.opts
    problems = contract.missing_programs(opts.launcher, opts.ds_launcher,
                                         {n: got[n][contract.PROGRAMS] for n in names}, head)
    if opts.launcher == "deepspeed":
        problems += contract.deepspeed_env_problems(
            head, got[head].get(factmod.FILE("~/.deepspeed_env")),
            got[head].get(factmod.FILE(job.vars[head]["env_file"])), opts.ds_launcher,
            got[head][factmod.GPUS]["count"])
    if opts.launcher == "deepspeed" and opts.ds_launcher == "pdsh":
        for what, word in (("the venv's python", job.python), ("the job directory", job.job_dir)):
            if not dsenv.pdsh_plain(word):
                problems.append(f"{head}: {what} {word!r} has characters DeepSpeed's pdsh launcher "
                                f"cannot carry ({dsenv.PDSH_COMMAND}); use a venv_path and a "
                                f"payload directory named with letters, digits and _@+=:,./- only")
    return problems


def port_problems(job, fleet, names: list[str]) -> list[str]:
    """A listener on the head's master port, a connect from every other machine."""
    others = [ns[0] for ns in job.topo.machines.values() if job.head.name not in ns]
    if not others or job.emu or job.opts.launcher == "srun":
        return []
    r = fleet.sessions[job.head.name].run(contract.listen_script(job.pythons[job.head.name], job.opts.port), timeout=30,
                                           label="listen on the master port")
    if "ready" not in r.stdout:
        return [f"{job.head.name}: cannot listen on port {job.opts.port}: {r.stdout.strip()[-200:]}"]
    got = fleet.map(lambda s: s.run(contract.connect_script(job.pythons[s.name], job.master_addr(),
                                                             job.opts.port), timeout=30,
                                    label="reach the master port").stdout.strip(), "port", only=others)
    pid = next((ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("pid ")), "")
    if pid.isdigit():   # free the port for the launch
        fleet.sessions[job.head.name].run(f"kill {pid} 2>/dev/null; true", timeout=10, label="stop listening")
    return [f"{n}: cannot reach {job.master_addr()}:{job.opts.port} on {job.head.name} "
            f"({v.removeprefix('fail ')}): open the port between the nodes (firewall), or --port"
            for n, v in sorted(got.items()) if not v.startswith("ok")]


def stale(job, fleet, topo) -> None:
    """Processes of earlier nodeprep jobs (and, on GPU nodes, any process holding a GPU)
    refuse the launch; --kill-stale stops the earlier jobs (never other processes)."""
    found, gpu = {}, []
    for ns in topo.machines.values():
        n = ns[0]
        for old, procs in jobs.stale(job.facts[n][jobs.JOB_PROCESSES], job.id).items():
            found.setdefault(old, {})[n] = procs
        gpu += [f"{n}: pid {p['pid']} {p['name']} holds {p['memory']} of GPU memory"
                for p in job.facts[n][jobs.GPU_APPS]]
    if found and job.opts.kill_stale:
        for old, where in found.items():
            fleet.map(lambda s, old=old: s.run(jobs.cleanup_script(old), timeout=30, label="kill stale"),
                      "kill stale", only=list(where))
            job.events.note(job.head.name, f"stopped earlier job {old} on {fold(list(where))}")
        return
    lines = [f"{n}: job {old} still runs pid {p['pid']}: {p['args'][:120]}"
             for old, where in found.items() for n, procs in where.items() for p in procs[:3]]
    if found or gpu:
        raise NodeprepError("processes of an earlier job are still running:\n  " +
                            "\n  ".join(lines + gpu),
                            hint="stop them with `invoke train.stop RUN`, or pass --kill-stale to "
                                 "stop earlier nodeprep jobs before this launch" if found else
                                 "stop the processes holding the GPUs")


def mesh_problems(job, fleet, names: list[str]) -> list[str]:
    head = fleet.sessions[job.head.name]
    peers = job.emu.names if job.emu else names
    mesh = parse_mesh(head.run(mesh_script(peers), timeout=60, label="preflight mesh").stdout)
    return [f"{job.head.name} -> {p}: ssh fails (exit {rc}) {err}".rstrip()
            for p, (rc, err) in sorted(mesh.items()) if rc != 0]
