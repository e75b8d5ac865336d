"""`invoke train`: sync the job directory (and the rank wrapper and watcher) to the same absolute
path on every node, preflight what makes launches hang (earlier jobs still running included),
and build each launcher's command around the rank wrapper; commands/supervise.py runs and
watches it (ops/train/jobs.py: how a job's processes are found and stopped)."""
from __future__ import annotations

import posixpath
import secrets
import shlex
import time
from dataclasses import asdict, dataclass, field

from nodeprep.commands import preflight
from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import TrainOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.results import RunLog
from nodeprep.errors import InputError, NodeprepError
from nodeprep.commands.supervise import Outcome, RunSpec, redacted_env
from nodeprep.ops import pystack
from nodeprep.ops.train import rundir as bundlemod
from nodeprep.ops.train import contract
from nodeprep.ops.train import emulate
from nodeprep.ops.train import jobs
from nodeprep.ops.train import launchers
from nodeprep.ops.train.jobs import JOB_VAR
from nodeprep.inventory.nodeset import fold
from nodeprep.ops.provision.topology import Topology, gpu_shares
from nodeprep.settings import Settings


@dataclass
class TrainResult:
    job_id: str
    where: str                                   # "2 node(s)", "2 emulated node(s) on worker-0"
    outcome: Outcome = field(default_factory=Outcome)
    commands: dict = field(default_factory=dict)  # --dry-run and srun: node -> its command
    launched: bool = True
    run_dir: str = ""
    detached: bool = False                       # the supervisor runs on in the background

    @property
    def failure(self) -> str | None:
        return self.outcome.failure

    @property
    def exit_code(self) -> int:
        if self.outcome.failure is None and not self.outcome.leftovers:
            return 0
        return 130 if self.outcome.state == "stopped" and (self.outcome.root or {}).get("kind") == \
            "interrupted" else 1


class Job:
    def __init__(self, opts: TrainOptions, inv, hosts, events: Events):
        self.opts, self.hosts, self.events = opts, hosts, events
        self.by_name = {h.name: h for h in hosts}     # per-node lookups: no scan of the fleet
        self.emu: emulate.Emulation | None = None
        if opts.emulate:
            emulate.check_emulate(opts.emulate, hosts, opts.launcher)
        self.root, self.script = jobs.resolve_payload(opts.payload)
        self.files = jobs.local_files(self.root, self.script)
        self.id = time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(3)
        self.vars = {h.name: {n: inv.var(h, n) for n in inv.schema} for h in hosts}
        self.head = hosts[0]
        self.results: dict = {}
        self.shares: dict[str, list[int]] = {}    # node -> its GPUs on a machine it shares
        self.pythons: dict[str, str] = {}         # node -> its venv's python
        self.job_dirs: dict[str, str] = {}        # node -> its job directory
        self.homes: dict[str, str] = {}           # node -> its home

    # -- stages ------------------------------------------------------------------------------
    def _probe(self, s):
        venv = self.vars[s.name]["venv_path"]
        reqs = [factmod.USER, factmod.GPUS, factmod.INTERFACES, factmod.IDENTITY, factmod.VENV(venv),
                factmod.TORCH_BUILD(factmod.TorchIn(venv)), jobs.JOB_PROCESSES, jobs.GPU_APPS]
        reqs.append(contract.PROGRAMS)
        if s.name == self.head.name:
            reqs.append(factmod.PORT_LISTENING(self.opts.port))
            if self.opts.launcher == "deepspeed":
                reqs += [factmod.FILE("~/.deepspeed_env"), factmod.FILE(self.vars[s.name]["env_file"])]
        return factmod.gather(s, reqs, self.vars[s.name])

    def _paths(self, got: dict, names: list[str]) -> list[str]:
        """Each node's interpreter and job directory. torchrun starts each node's own; the
        other launchers start the head node's on every node, so they must all be the same."""
        self.pythons = {n: pystack.venv_path(self.vars[n], got[n]) + "/bin/python" for n in names}
        self.homes = {n: got[n][factmod.USER]["home"] for n in names}
        self.job_dirs = {n: posixpath.join(got[n][factmod.USER]["home"], ".nodeprep", "jobs", self.root.name)
                         for n in names}
        head = self.head.name
        self.python, self.job_dir = self.pythons[head], self.job_dirs[head]
        odd = sorted(set(self.pythons.values()) | set(self.job_dirs.values()))
        if len(odd) > 2 and (self.opts.launcher != "torchrun" or self.opts.emulate):
            return [f"home or venv path differs between nodes ({', '.join(odd)}): "
                    f"{self.opts.launcher} starts the head node's interpreter and cwd everywhere "
                    "(DeepSpeed needs one path): use one venv_path (and home) for all nodes, "
                    "or --launcher torchrun, which starts each node's own"]
        return []

    def prepare(self, fleet) -> None:
        """Facts, job dir sync and preflight; raises NodeprepError listing what blocks."""
        names, opts = [h.name for h in self.hosts], self.opts
        got = self.facts = fleet.map(self._probe, "facts")
        self._fail_if_nodes_failed(fleet)
        problems = self._paths(got, names)
        for n in names:
            if not got[n][factmod.VENV(self.vars[n]["venv_path"])]["exists"]:
                problems.append(f"{n}: no venv at {self.vars[n]['venv_path']} (run `invoke provision`)")
        if got[self.head.name].get(factmod.PORT_LISTENING(opts.port)):
            problems.append(f"{self.head.name}: master port {opts.port} is already in use (--port)")
        if opts.emulate:
            self.emu = emulate.plan_emulation(self.head, opts.emulate, got[self.head.name][factmod.GPUS]["count"],
                                              opts.launcher, opts.emulate_network)
            fleet.map(lambda s: emulate.write_aliases(s, self.emu, self.head), "emulate")
            self._fail_if_nodes_failed(fleet)
            self.events.note(self.head.name, self.emu.describe())
        topo = self.topo = Topology.of(got, names)
        if opts.preflight:
            problems += preflight.contract_problems(self, got, names)
            if not problems:
                problems += preflight.port_problems(self, fleet, names)
        if opts.preflight and opts.launcher in ("deepspeed", "mpirun"):
            problems += preflight.mesh_problems(self, fleet, names)
        self.shares = gpu_shares(topo, names, {n: got[n][factmod.GPUS]["count"] for n in names})
        problems += self._share_problems(topo)
        if problems and opts.preflight:
            raise NodeprepError("preflight failed:\n  " + "\n  ".join(problems),
                                hint="fix these, or --no-preflight to launch anyway")
        preflight.stale(self, fleet, topo)
        # once per home: nodes sharing one (NFS) see the same job directory
        homes = [ns[0] for ns in topo.homes.values()]
        pushed = fleet.map(lambda s: jobs.sync(s, self.files, self.job_dirs[s.name]) +
                           jobs.sync(s, jobs.agent_files(), jobs.agent_dir(self.homes[s.name])),
                           "sync", only=homes)
        self._fail_if_nodes_failed(fleet)
        self.events.note(self.head.name, f"job {self.id}: {sum(pushed.values())} file(s) pushed to "
                                         f"{self.job_dir} on {len(names)} node(s)" +
                         (f" ({len(homes)} home(s))" if len(homes) < len(names) else ""))

    def _share_problems(self, topo) -> list[str]:
        """Nodes that are one machine: their slots must fit in their share of its GPUs, and
        mpirun cannot give each its own (Open MPI numbers local ranks from 0 on each)."""
        out = []
        for n, devs in self.shares.items():
            h = self.by_name[n]
            if h.slots and h.slots > len(devs):
                out.append(f"{n}: {h.slots} slots, but it shares its machine with "
                           f"{fold(topo.machines[topo.machine_of[n]])}: {len(devs)} GPU(s) are its own")
        if self.shares and self.opts.launcher == "mpirun":
            out.append(f"{fold(sorted(self.shares))}: nodes on one machine would share GPUs under mpirun "
                       "(use deepspeed or torchrun)")
        return out

    def _fail_if_nodes_failed(self, fleet):
        bad = {n: r.message for n, r in fleet.results.items() if r.status in ("failed", "unreachable")}
        if bad:
            raise NodeprepError("cannot start the job: " + "; ".join(f"{n}: {m}" for n, m in bad.items()))

    # -- what runs where ---------------------------------------------------------------------
    def slots(self, name) -> int:
        if name in self.shares:
            return len(self.shares[name])
        h = self.by_name[name]
        return h.slots or self.facts[name][factmod.GPUS]["count"] or h.vars.get("cpu_slots") or 1

    def master_addr(self) -> str:
        return self.head.address

    def nodes(self) -> list[launchers.NodeSlots]:
        if self.emu:   # aliases carry HostName/Port in ~/.ssh/config: no --ssh_port
            return [launchers.NodeSlots(n, self.head.address, k, 22)
                    for n, k in zip(self.emu.names, self.emu.hostfile_slots)]
        return [launchers.NodeSlots(h.name, h.address, self.slots(h.name), h.port) for h in self.hosts]

    def srun_prefix(self):
        """srun --label starts each line with its task number; tasks go to the nodes in blocks
        of --ntasks-per-node (srun's default distribution), so the line gets its node's name."""
        nodes = self.nodes()
        names, per = [n.name for n in nodes], nodes[0].slots
        return lambda line: launchers.srun_line_node(line, names, per) or self.head.name

    def session_of(self, label: str) -> str:
        """The inventory node a command label runs on (emulated nodes: the one machine)."""
        return self.head.name if self.emu else label

    def program(self, node: str | None = None) -> launchers.Program:
        """What the ranks run: the head node's interpreter, or NODE's own (torchrun)."""
        script = self.script.name if self.script.parent == self.root else str(self.script.relative_to(self.root))
        python = self.pythons.get(node, self.python) if node else self.python
        # the node's home (job dirs are <home>/.nodeprep/jobs/<name>)
        home = self.homes.get(node or self.head.name) or posixpath.dirname(posixpath.dirname(
            posixpath.dirname(self.job_dirs.get(node, self.job_dir) if node else self.job_dir)))
        # the rank wrapper (payloads/rank.py) runs the script and records how the rank ends
        rank = posixpath.join(jobs.agent_dir(home), "rank.py")
        return launchers.Program(python, rank, [script, *self.opts.args])

    def _env(self) -> str:
        env = (f"export {JOB_VAR}={self.id} MASTER_ADDR={shlex.quote(self.master_addr())} "
               f"MASTER_PORT={self.opts.port}; ")
        if self.emu and self.emu.network:
            env += "export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; "
        return env

    def _torchrun(self, nodes, cd: str) -> dict[str, str]:
        per = self.emu.per_node if self.emu else nodes[0].slots
        argv = launchers.torchrun_cmd(self.program(), len(nodes), per,
                                      (f"{self.master_addr()}:{self.opts.port}", self.id),
                                      self.opts.max_restarts)
        if not self.emu and len(set(self.pythons.values()) | set(self.job_dirs.values())) > 2:
            # each node its own venv and job directory (paths that differ by group)
            own = {n.name: launchers.torchrun_cmd(self.program(n.name), len(nodes), per,
                                                  (f"{self.master_addr()}:{self.opts.port}", self.id),
                                                  self.opts.max_restarts) for n in nodes}
            return {n.name: f"cd {shlex.quote(self.job_dirs[n.name])} && " + self._env() + shlex.join(own[n.name])
                    for n in nodes}
        if self.emu and self.emu.devices:
            return {n.name: cd + self._env() + f"export CUDA_VISIBLE_DEVICES={vis}; " + shlex.join(argv)
                    for n, vis in zip(nodes, self.emu.cuda_visible)}
        if self.shares:       # torchrun needs the same --nproc-per-node on every node
            if len({n.slots for n in nodes}) > 1:
                raise InputError("torchrun needs the same number of processes on every node, but "
                                 "nodes sharing a machine get fewer GPUs each",
                                 hint="use --launcher deepspeed, or select whole machines")
            vis = {n: "export CUDA_VISIBLE_DEVICES=" + ",".join(map(str, d)) + "; "
                   for n, d in self.shares.items()}
            return {n.name: cd + self._env() + vis.get(n.name, "") + shlex.join(argv) for n in nodes}
        return {n.name: cd + self._env() + shlex.join(argv) for n in nodes}

    def _deepspeed(self, nodes, cd: str) -> dict[str, str]:
        opts = self.opts
        include = self.emu.include if self.emu else None
        if self.shares:       # physical GPU ids: the hostfile gives each such node all of them
            full = {h.name: self.facts[h.name][factmod.GPUS]["count"] for h in self.hosts}
            include = "@".join(f"{n.name}:{','.join(map(str, self.shares.get(n.name, range(n.slots))))}"
                               for n in nodes)
            nodes = [launchers.NodeSlots(n.name, n.address, full[n.name] if n.name in self.shares else n.slots,
                                         n.port) for n in nodes]
        argv = launchers.deepspeed_cmd(self.program(), nodes, (self.master_addr(), opts.port),
                                       opts.ds_launcher,
                                       ssh_port=None if self.emu or self.head.port == 22 else self.head.port,
                                       include=include)
        argv = launchers.fill_hostfile(argv, "hostfile")
        write = f"printf %s {shlex.quote(launchers.hostfile(nodes))} > hostfile && "
        if opts.ds_launcher == "openmpi":
            # DeepSpeed's openmpi runner passes no master address to the ranks (launch.py
            # does that for pdsh); it -x exports what its env file holds. DS_ENV_FILE names
            # that file (an absolute path wins over ~ and the cwd in its os.path.join): the
            # user's ~/.deepspeed_env plus the master address, in this run's directory, so
            # nothing is left in the job directory for a later pdsh run to pick up.
            dse = f"MASTER_ADDR={self.master_addr()}\nMASTER_PORT={opts.port}\n"
            env_file = f'"$HOME/.nodeprep/runs/{self.id}/deepspeed_env"'
            write += (f"mkdir -p \"$HOME/.nodeprep/runs/{self.id}\" && {{ [ -f \"$HOME/.deepspeed_env\" ] && "
                      f"sed -e '$a\\' \"$HOME/.deepspeed_env\"; printf %s {shlex.quote(dse)}; }} > {env_file} && "
                      f"export DS_ENV_FILE={env_file} && ")
        return {self.head.name: cd + write + self._env() + shlex.join(argv)}

    def commands(self) -> dict[str, str]:
        """label (node, or emulated node) -> shell command (run from the job dir, tagged with
        the job id)."""
        nodes, launcher = self.nodes(), self.opts.launcher
        cd = f"cd {shlex.quote(self.job_dir)} && "
        if launcher == "torchrun":
            return self._torchrun(nodes, cd)
        if launcher == "deepspeed":
            return self._deepspeed(nodes, cd)
        if launcher == "srun":
            argv = launchers.srun_cmd(self.program(), nodes, nodes[0].slots,
                                      {JOB_VAR: self.id, "MASTER_ADDR": self.master_addr(),
                                       "MASTER_PORT": str(self.opts.port)})
            return {self.head.name: cd + shlex.join(argv)}
        if launcher == "mpirun":
            extra = ["NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"] if self.emu and self.emu.network else []
            argv = launchers.mpirun_cmd(self.program(), nodes, (self.master_addr(), self.opts.port),
                                        [JOB_VAR] + extra)
            return {self.head.name: cd + self._env() + shlex.join(argv)}
        raise InputError(f"--launcher {launcher}: not runnable here")

    # -- what the supervisor gets ------------------------------------------------------------
    def layout(self) -> list[list] | None:
        """[[label, ranks], ...] in global rank order: DeepSpeed (hostfile order, included
        slots), mpirun (-map-by slot) and srun (block) number the ranks node by node; torchrun's
        rendezvous picks the order, so its ranks say their node (NODEPREP_NODE)."""
        if self.opts.launcher == "torchrun":
            return None
        if self.emu:
            counts = [len(d) for d in self.emu.devices] if self.emu.devices else [self.emu.per_node] * len(self.emu.names)
            return [[n, c] for n, c in zip(self.emu.names, counts)]
        return [[n.name, len(self.shares[n.name]) if n.name in self.shares else n.slots] for n in self.nodes()]

    def spec(self, settings) -> RunSpec:
        cmds = self.commands()
        if self.opts.launcher == "torchrun":
            cmds = {label: f"export NODEPREP_NODE={shlex.quote(label)}; " + cmd for label, cmd in cmds.items()}
        names = [h.name for h in self.hosts]
        machines = [ns[0] for ns in self.topo.machines.values()] if not self.emu else [self.head.name]
        machine_of = {n: ns[0] for ns in self.topo.machines.values() for n in ns}
        versions = {n: {k: (self.facts[n].get(factmod.TORCH_BUILD(factmod.TorchIn(self.vars[n]["venv_path"])))
                            or {}).get(k) for k in ("version", "cuda", "nccl")} for n in names}
        env = {JOB_VAR: self.id, "MASTER_ADDR": self.master_addr(), "MASTER_PORT": self.opts.port,
               **(self.vars[self.head.name].get("deepspeed_env") or {}),
               **(self.vars[self.head.name].get("nccl_env") or {})}
        return RunSpec(self.id, self.opts.launcher, self.where(), self.opts.inventory, self.opts.limit, names,
                       {label: [self.session_of(label), cmd] for label, cmd in cmds.items()},
                       {m: [self.pythons[m], jobs.agent_dir(self.homes[m])] for m in machines},
                       self.layout(), names=sorted(set(names) | set(self.emu.names if self.emu else [])),
                       restarts=self.opts.launcher == "torchrun" and self.opts.max_restarts > 0,
                       hang_timeout=self.opts.hang_timeout, timeout=self.opts.timeout,
                       ranks_shown=list(self.opts.ranks) if self.opts.ranks is not None else None,
                       machine_of=machine_of, versions=versions, env=redacted_env(env))

    def where(self) -> str:
        return (f"{len(self.emu.names)} emulated node(s) on {self.head.name}" if self.emu
                else f"{len(self.hosts)} node(s)")


def _check_slurm(fleet, job: Job) -> None:
    head = fleet.sessions[job.head.name]
    r = head.run("command -v srun >/dev/null 2>&1 || exit 3; sinfo -h -o %D", label="srun?")
    if r.rc == 3:
        raise NodeprepError(f"srun not found on {job.head.name}: no Slurm here; the "
                            "command above is what would run inside an allocation")
    if r.rc != 0:
        raise NodeprepError(f"Slurm is not usable from {job.head.name}: "
                            f"{r.tail(1) or 'sinfo failed'}",
                            hint="the command above is what would run; on the lab: "
                                 "`invoke lab.up --slurm`")


def supervise(spec: RunSpec, fleet, events: Events, run_dir) -> Outcome:
    """Run and watch a prepared job to its end (attached, or in the detached supervisor)."""
    from nodeprep.commands.supervise import Supervisor
    bundle = bundlemod.Bundle(run_dir)
    sup = Supervisor(spec, fleet, events, bundle)
    try:
        return sup.run()
    finally:
        bundle.close()


def train(opts: TrainOptions, settings: Settings, events: Events) -> TrainResult:
    """The srun command is shown before it runs (events.note), as --dry-run shows every one.
    --detach: prepare here, then the cli starts the supervisor in the background."""
    opts.check()
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    job = Job(opts, inv, hosts, events)
    run_dir = bundlemod.run_path(settings.runs, job.id)
    run_dir.mkdir(parents=True, exist_ok=True)
    with Fleet(hosts, settings, "train", events, runlog=RunLog(run_dir)) as fleet:
        job.prepare(fleet)
        if opts.dry_run:
            return TrainResult(job.id, job.where(), commands=job.commands(), launched=False, run_dir=str(run_dir))
        spec = job.spec(settings)
        cmds = {label: cmd for label, (_node, cmd) in spec.commands.items()}
        if opts.launcher == "srun":
            for node, cmd in cmds.items():
                events.note(node, cmd)
            _check_slurm(fleet, job)
        if opts.detach:
            bundlemod.Bundle(run_dir).write_json("job.json", asdict(spec))
            return TrainResult(job.id, job.where(), commands=cmds, run_dir=str(run_dir), detached=True)
        outcome = supervise(spec, fleet, events, run_dir)
        return TrainResult(job.id, job.where(), outcome, cmds if opts.launcher == "srun" else {},
                           run_dir=str(run_dir))
