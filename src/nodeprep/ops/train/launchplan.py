"""The launch plan of one `train` run: built ONCE from the inventory and the nodes' facts
(commands/train/prepare.py), checked by preflight, turned into the supervisor's RunSpec.
Every launcher's command line is built here and only here (the argv by launchers.py, the GPU
split by gpusplit.py). Pure: no ssh, so every shape is unit-tested as data."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path

from nodeprep.engine.facts import GPUS, USER
from nodeprep.engine.facts.jobs import JOB_VAR, RESTART_VAR
from nodeprep.errors import InputError
from nodeprep.inventory import dsfilter
from nodeprep.inventory.dsfilter import Filter
from nodeprep.inventory.nodeset import fold
from nodeprep.ops.provision.topology import Topology
from nodeprep.ops.pystack.paths import venv_path
from nodeprep.ops.train import gpusplit, incontainer, launchers
from nodeprep.ops.train.emulate import Emulation
from nodeprep.ops.train.launchers import fill_hostfile as fill
from nodeprep.ops.train.payload import NODE_RUNS, agent_dir

# --emulate-network: NCCL must take the network path between emulated nodes on one machine
NETWORK_PATH = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


@dataclass(frozen=True)
class NodeRun:
    """One inventory node as the launch sees it."""

    name: str
    address: str  # on the training network: MASTER_ADDR and the rendezvous use it
    port: int  # sshd port
    _: KW_ONLY
    slots: int  # processes on it: len(devices) when chosen, else the inventory's
    # slots, its GPUs, cpu_slots, or 1
    given_slots: int | None  # the inventory's `slots`
    gpus: int  # GPUs of its machine (the gpus fact)
    home: str
    python: str  # its venv's interpreter
    job_dir: str  # <home>/.nodeprep/jobs/<payload directory name>
    machine: str  # the first selected node of its machine: that node's watcher covers it
    pool: int = 1  # the slots its device ids index (the hostfile's `slots=`): its machine's
    # GPUs on a shared machine, else its own slots
    devices: tuple[int, ...] | None = None  # its GPU (slot) ids when not all of the pool: its share
    # of a shared machine, or the slots --limit chose


@dataclass(frozen=True)
class Split:
    """Which GPUs each node gets: BY_MACHINE_ID (Topology.by_machine_id), the SHARES of shared
    machines (gpusplit.machine_shares), and the slots a DeepSpeed-style --limit CHOSE
    (inventory/dsfilter.py: slot i of a node is its i-th GPU)."""

    by_machine_id: dict[str, list[str]]
    shares: dict[str, list[int]] = field(default_factory=dict)
    chosen: Filter | None = None


def node_runs(hosts, facts: dict, vars_of: dict, job_name: str, split: Split) -> list[NodeRun]:
    """HOSTS (inventory order, the head first) with their FACTS (USER, GPUS) and variables, as
    SPLIT divides the GPUs; a node the --limit filter leaves without slots is not in the answer."""
    shares, chosen = split.shares, split.chosen
    machine_of = {n: ns[0] for ns in split.by_machine_id.values() for n in ns}
    own = {}
    for h in hosts:
        gpus = facts[h.name][GPUS]["count"]
        own[h.name] = (
            list(shares[h.name]) if h.name in shares else None,
            h.slots or gpus or h.vars.get("cpu_slots") or 1,
        )
    picked = (
        dsfilter.apply(chosen, {n: len(d) if d is not None else k for n, (d, k) in own.items()})
        if chosen
        else None
    )
    out = []
    for h in hosts:
        if picked is not None and h.name not in picked:
            continue
        f = facts[h.name]
        home, gpus = f[USER]["home"], f[GPUS]["count"]
        share, base = own[h.name]
        devices = share
        if picked is not None and picked[h.name] != list(
            range(len(share) if share is not None else base)
        ):
            devices = [share[i] for i in picked[h.name]] if share is not None else picked[h.name]
        slots = len(devices) if devices is not None else base
        out.append(
            NodeRun(
                h.name,
                h.address,
                h.port,
                slots=slots,
                given_slots=h.slots,
                gpus=gpus,
                home=home,
                python=venv_path(vars_of[h.name], f) + "/bin/python",
                job_dir=posixpath.join(home, ".nodeprep", "jobs", job_name),
                machine=machine_of.get(h.name, h.name),
                pool=gpus if share is not None else base,
                devices=tuple(devices) if devices is not None else None,
            )
        )
    return out


@dataclass
class LaunchPlan:
    job_id: str
    launcher: str  # deepspeed | torchrun | mpirun | srun
    script: str  # the payload, relative to the job directory
    nodes: list[NodeRun]  # the head first
    args: tuple = ()  # the payload's own arguments
    ds_launcher: str = "pdsh"  # DeepSpeed's multinode launcher: pdsh | openmpi
    port: int = 29500  # the master (rendezvous) port
    max_restarts: int = 0  # torchrun --max-restarts
    restart: int = 0  # train --restarts: this launch's attempt past the first (RESTART_VAR)
    shares: dict[str, list[int]] = field(default_factory=dict)  # node -> GPUs on a shared machine
    emu: Emulation | None = None  # --emulate: the one machine as M nodes
    # the container way: ranks run in the job's containers (every NodeRun.python is the image's)
    containers: incontainer.JobContainers | None = None

    def __post_init__(self):
        self._by_name = {n.name: n for n in self.nodes}

    def in_containers(self, boxes: incontainer.JobContainers) -> LaunchPlan:
        """This plan on the container way: the ranks run the image's Python in BOXES."""
        nodes = [replace(n, python=incontainer.PYTHON) for n in self.nodes]
        return replace(self, nodes=nodes, containers=boxes)

    @property
    def head(self) -> NodeRun:
        return self.nodes[0]

    @property
    def master_addr(self) -> str:
        return self.head.address

    def node(self, name: str) -> NodeRun:
        return self._by_name[name]

    def machines(self) -> list[str]:
        """The node of each machine whose watcher covers it (the one machine under --emulate)."""
        return [self.head.name] if self.emu else list(dict.fromkeys(n.machine for n in self.nodes))

    def where(self) -> str:
        return (
            f"{len(self.emu.names)} emulated node(s) on {self.head.name}"
            if self.emu
            else f"{len(self.nodes)} node(s)"
        )

    def session_of(self, label: str) -> str:
        """The inventory node a command label runs on (emulated nodes: the one machine)."""
        return self.head.name if self.emu else label

    # -- what preflight checks of the plan itself -----------------------------------------------
    def _paths(self) -> list[str]:
        return sorted({n.python for n in self.nodes} | {n.job_dir for n in self.nodes})

    def own_paths(self) -> bool:
        """Do interpreters or job directories differ between nodes (e.g. by platform group)?"""
        return len(self._paths()) > 2

    def path_problems(self) -> list[str]:
        """torchrun starts each node's own interpreter in its own job directory; the other
        launchers start the head's everywhere, so the paths must be the same."""
        if self.own_paths() and (self.launcher != "torchrun" or self.emu):
            return [
                f"home or venv path differs between nodes ({', '.join(self._paths())}): "
                f"{self.launcher} starts the head node's interpreter and cwd everywhere "
                "(DeepSpeed needs one path): use one venv_path (and home) for all nodes, "
                "or --launcher torchrun, which starts each node's own"
            ]
        return []

    def share_problems(self) -> list[str]:
        """Nodes that are one machine: their slots must fit in their share of its GPUs, and
        mpirun cannot give each its own (Open MPI numbers local ranks from 0 on each)."""
        out = []
        for name, devs in self.shares.items():
            n = self._by_name.get(name)
            if n and n.given_slots and n.given_slots > len(devs):
                mates = [m.name for m in self.nodes if m.machine == n.machine]
                out.append(
                    f"{name}: {n.given_slots} slots, but it shares its machine with "
                    f"{fold(mates)}: {len(devs)} GPU(s) are its own"
                )
        if self.shares and self.launcher == "mpirun":
            out.append(
                f"{fold(sorted(self.shares))}: nodes on one machine would share GPUs under mpirun "
                "(use deepspeed or torchrun)"
            )
        return out

    # -- what runs where ---------------------------------------------------------------------------
    def slot_layout(self) -> list[launchers.NodeSlots]:
        """The hostfile's nodes: the inventory's, or the emulated ones (their ssh aliases carry
        HostName and Port: no --ssh_port)."""
        if self.emu:
            return [
                launchers.NodeSlots(n, self.head.address, k, 22)
                for n, k in zip(self.emu.names, self.emu.hostfile_slots)
            ]
        return [launchers.NodeSlots(n.name, n.address, n.slots, n.port) for n in self.nodes]

    def layout(self) -> list[list] | None:
        """[[label, ranks], ...] in global rank order: DeepSpeed (hostfile order, included
        slots), mpirun (-map-by slot) and srun (block) number the ranks node by node; torchrun's
        rendezvous picks the order, so its ranks say their node (NODEPREP_NODE)."""
        if self.launcher == "torchrun":
            return None
        if self.emu:
            counts = (
                [len(d) for d in self.emu.devices]
                if self.emu.devices
                else [self.emu.per_node] * len(self.emu.names)
            )
            return [[n, c] for n, c in zip(self.emu.names, counts)]
        return [[n.name, n.slots] for n in self.nodes]

    def program(self, node: NodeRun | None = None) -> launchers.Program:
        """What the ranks run: the rank wrapper (nodeside/rank.py, in the agent directory)
        around the payload, under the head node's interpreter, or NODE's own (torchrun)."""
        n = node or self.head
        prefix = ()
        if self.containers and self.launcher in ("mpirun", "srun"):
            prefix = self.containers.rank_prefix(self.head.name)
        return launchers.Program(
            n.python,
            posixpath.join(agent_dir(n.home), "rank.py"),
            [self.script, *self.args],
            prefix,
        )

    def env(self) -> dict[str, str]:
        """What every launcher exports to the ranks (besides what the user's files hold)."""
        out = {JOB_VAR: self.job_id, "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.port)}
        if self.restart:
            out[RESTART_VAR] = str(self.restart)
        return {**out, **(NETWORK_PATH if self.emu and self.emu.network else {})}

    def _exports(self) -> str:
        return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env().items()) + "; "

    def commands(self) -> dict[str, str]:
        """label (node, or emulated node) -> shell command, run from the job directory."""
        build = {
            "torchrun": self._torchrun,
            "deepspeed": self._deepspeed,
            "srun": self._srun,
            "mpirun": self._mpirun,
        }.get(self.launcher)
        if build is None:
            raise InputError(f"--launcher {self.launcher}: not runnable here")
        cmds = build(self.slot_layout(), f"cd {shlex.quote(self.head.job_dir)} && ")
        if self.containers and self.launcher in ("torchrun", "deepspeed"):
            # the launcher itself runs in each node's container
            return {k: self.containers.wrap(self.session_of(k), c) for k, c in cmds.items()}
        return cmds

    def _torchrun(self, slots, cd: str) -> dict[str, str]:
        per = self.emu.per_node if self.emu else slots[0].slots
        rdzv = (f"{self.master_addr}:{self.port}", self.job_id)
        visible = self._visible(slots)

        def line(label: str, node=None) -> str:
            argv = launchers.torchrun_cmd(
                self.program(node), len(slots), per, rdzv, self.max_restarts
            )
            return (
                self._exports()
                + (f"export CUDA_VISIBLE_DEVICES={visible[label]}; " if label in visible else "")
                + shlex.join(argv)
            )

        if not self.emu and self.own_paths():  # each node its own venv and job directory
            return {
                n.name: f"cd {shlex.quote(n.job_dir)} && " + line(n.name, n) for n in self.nodes
            }
        return {s.name: cd + line(s.name) for s in slots}

    def _visible(self, slots) -> dict[str, str]:
        """CUDA_VISIBLE_DEVICES per label: the emulated nodes' split, or the chosen devices
        (torchrun takes one --nproc-per-node for every node: they must get as many)."""
        if self.emu:
            return dict(zip([s.name for s in slots], gpusplit.visible(self.emu.devices or [])))
        chosen = [n for n in self.nodes if n.devices is not None]
        if chosen and len({s.slots for s in slots}) > 1:
            raise InputError(
                "torchrun needs the same number of processes on every node, but "
                + ", ".join(f"{n.name} gets {n.slots}" for n in self.nodes),
                hint="use --launcher deepspeed, or select whole machines and the "
                "same number of slots on each node",
            )
        return {n.name: gpusplit.visible([n.devices])[0] for n in chosen}

    def _deepspeed(self, slots, cd: str) -> dict[str, str]:
        include = self.emu.include if self.emu else None
        if not self.emu and any(n.devices is not None for n in self.nodes):
            # physical ids: the hostfile gives each node its whole pool, --include picks
            include = gpusplit.include(
                [n.name for n in self.nodes],
                [n.devices if n.devices is not None else range(n.pool) for n in self.nodes],
            )
            slots = [launchers.NodeSlots(n.name, n.address, n.pool, n.port) for n in self.nodes]
        argv = launchers.deepspeed_cmd(
            self.program(),
            slots,
            (self.master_addr, self.port),
            self.ds_launcher,
            ssh_port=None if self.emu or self.head.port == 22 else self.head.port,
            include=include,
        )
        write = f"printf %s {shlex.quote(launchers.hostfile(slots))} > hostfile && "
        if self.containers:  # every node runs its own part: no pdsh, no ssh into a container
            script = self.program().script
            own = [incontainer.deepspeed_node(argv, i, script) for i in range(len(self.nodes))]
            return {
                n.name: cd + write + self._exports() + shlex.join(fill(a, "hostfile"))
                for n, a in zip(self.nodes, own)
            }
        if self.ds_launcher == "openmpi":
            write += self._openmpi_env_file()
        return {
            self.head.name: cd
            + write
            + self._exports()
            + shlex.join(launchers.fill_hostfile(argv, "hostfile"))
        }

    def _openmpi_env_file(self) -> str:
        """DeepSpeed's openmpi runner passes no master address to the ranks: it -x exports its
        env file's lines, so DS_ENV_FILE (an absolute path wins) names ~/.deepspeed_env plus the
        master address, in this run's directory (nothing left for a later pdsh run)."""
        dse = f"MASTER_ADDR={self.master_addr}\nMASTER_PORT={self.port}\n"
        env_file = f'"$HOME/{NODE_RUNS}/{self.job_id}/deepspeed_env"'
        return (
            f'mkdir -p "$HOME/{NODE_RUNS}/{self.job_id}" && {{ [ -f "$HOME/.deepspeed_env" ] && '
            "sed -e '$a\\' \"$HOME/.deepspeed_env\"; "
            f"printf %s {shlex.quote(dse)}; }} > {env_file} && "
            f"export DS_ENV_FILE={env_file} && "
        )

    def _whole_nodes(self) -> None:
        """mpirun and srun start N ranks per node with local ranks from 0: they cannot give a
        node chosen GPUs (--limit NAME:SLOTS); on a shared machine preflight says so first."""
        chosen = [n.name for n in self.nodes if n.devices is not None and n.name not in self.shares]
        if chosen:
            raise InputError(
                f"{self.launcher} cannot run on chosen slots of {fold(chosen)} (--limit "
                "NAME:SLOTS): it numbers each node's ranks from 0",
                hint="use --launcher deepspeed or torchrun, or select whole nodes",
            )

    def _srun(self, slots, cd: str) -> dict[str, str]:
        self._whole_nodes()
        argv = launchers.srun_cmd(self.program(), slots, slots[0].slots, self.env())
        return {self.head.name: cd + shlex.join(argv)}

    def _mpirun(self, slots, cd: str) -> dict[str, str]:
        self._whole_nodes()
        names = [k for k in self.env() if k not in ("MASTER_ADDR", "MASTER_PORT")]
        argv = launchers.mpirun_cmd(self.program(), slots, (self.master_addr, self.port), names)
        if self.emu:
            # every emulated node's orted runs on the one machine under one host name: each
            # gets a session directory of its own (the remote shell's $$), or two of them race
            # creating the same one ("ORTE_ERROR_LOG ... session_dir.c: File exists")
            argv[1:1] = [
                "-mca",
                "orte_launch_agent",
                "env OMPI_MCA_orte_tmpdir_base=/tmp/nodeprep-orted-$$ orted",
            ]
        return {self.head.name: cd + self._exports() + shlex.join(argv)}


@dataclass
class Prepared:
    """A job ready to launch: its plan and what the plan was built from."""

    plan: LaunchPlan
    facts: dict  # node -> the train probe's FactValues
    vars: dict  # node -> the node's resolved inventory variables
    _: KW_ONLY
    files: dict[str, Path]  # the payload's files, synced into the job directory
    topo: Topology
    container_problems: tuple[str, ...] = ()  # the container way: engine or image missing
    left_out: tuple[str, ...] = ()  # nodes the health gate left out (--exclude-unhealthy)

    @property
    def job_id(self) -> str:
        return self.plan.job_id
