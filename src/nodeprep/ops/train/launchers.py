"""Pure command builders for the four launchers `invoke train` drives: no ssh, no I/O.

Each builder returns an argv list (run it with subprocess, or `shell()` it for a remote
shell: shlex quoting, so odd arguments survive). Facts they encode, from the launchers' own
documentation: the DeepSpeed hostfile grammar and --include slots, pdsh's single --ssh_port
(https://www.deepspeed.ai/getting-started/#resource-configuration-multi-node), torchrun's
identical-on-every-node rendezvous arguments (https://pytorch.org/docs/stable/elastic/run.html),
Open MPI's -x forwarding (https://docs.open-mpi.org/en/v5.0.x/man-openmpi/man1/mpirun.1.html)
and Slurm's --export (https://slurm.schedmd.com/srun.html). Invalid input raises InputError
before anything runs, naming what is wrong and how to fix it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from nodeprep.errors import InputError
from nodeprep.inventory import nodeset

# deepspeed_cmd leaves this placeholder where the hostfile path goes: the caller writes the
# file on the launching node and substitutes the path with fill_hostfile().
HOSTFILE = "{hostfile}"
LAUNCHERS = ("deepspeed", "torchrun", "mpirun", "srun")  # train --launcher
# every multinode launcher DeepSpeed's runner knows (nodeprep drives dsenv.SUPPORTED_DS_LAUNCHERS)
DEEPSPEED_LAUNCHERS = ("pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Program:
    """What every rank runs: the venv's interpreter, the script, its arguments; PREFIX: what
    mpirun and srun start it under (the exec into the job's container, ops/train/incontainer)."""

    python: str
    script: str
    args: tuple | list = ()
    prefix: tuple = ()


def _script_argv(prog: Program) -> list[str]:
    # SCRIPT ARGS as argv tokens, one token per value
    return [str(prog.script), *map(str, prog.args)]


@dataclass
class NodeSlots:
    name: str  # as ssh/pdsh/mpirun reach it (an ~/.ssh/config alias or a DNS name)
    address: str  # its IP on the training network (for MASTER_ADDR / rendezvous)
    slots: int  # processes (GPUs) on this node
    port: int = 22  # sshd port


def from_hosts(hosts, slots: int | None = None) -> list[NodeSlots]:
    """Inventory Hosts -> NodeSlots; a host's own `slots` wins over SLOTS, default 1."""
    return [NodeSlots(h.name, h.address, h.slots or slots or 1, h.port or 22) for h in hosts]


def shell(argv: list[str]) -> str:
    """argv as one shell command line, every value quoted where needed (shlex.join)."""
    return shlex.join(str(a) for a in argv)


def fill_hostfile(argv: list[str], path: str) -> list[str]:
    """argv with the HOSTFILE placeholder token replaced by PATH (whole tokens only)."""
    return [path if a == HOSTFILE else a for a in argv]


def _check_nodes(nodes) -> list[NodeSlots]:
    nodes = list(nodes)
    if not nodes:
        raise InputError("no nodes to launch on", "check the inventory and --limit")
    seen = set()
    for n in nodes:
        if not n.name or re.search(r"[\s,:@]", n.name):
            # whitespace breaks the hostfile line, ',' ':' '@' the -H / --include grammars
            raise InputError(
                f"node name {n.name!r} cannot go in a hostfile",
                "use names without spaces, ',', ':' or '@'",
            )
        if n.name in seen:  # DeepSpeed's hostfile parser raises on duplicate hosts
            raise InputError(f"node '{n.name}' is listed twice", "list each node once")
        seen.add(n.name)
        if not isinstance(n.slots, int) or n.slots < 1:
            raise InputError(
                f"node '{n.name}' has slots={n.slots!r}",
                "slots must be a whole number >= 1 (GPUs, or 1 on CPU)",
            )
    return nodes


def hostfile(nodes) -> str:
    """DeepSpeed/MPI hostfile text: one `NAME slots=N` line per node, first node = rank 0."""
    return "".join(f"{n.name} slots={n.slots}\n" for n in _check_nodes(nodes))


def _common_port(nodes: list[NodeSlots], ssh_port: int | None, who: str) -> int:
    # pdsh and mpirun's rsh agent take ONE ssh port for every node
    if ssh_port is not None:
        return int(ssh_port)
    ports = sorted({n.port for n in nodes})
    if len(ports) > 1:
        raise InputError(
            f"{who} uses one ssh port for every node, but the nodes listen on "
            f"ports {', '.join(map(str, ports))}",
            "give each node a Host block with its Port in the launching node's "
            "~/.ssh/config and pass ssh_port=22",
        )
    return ports[0]


def _check_include(include: str, nodes: list[NodeSlots]) -> None:
    slots = {n.name: n.slots for n in nodes}
    for part in include.split("@"):
        name, _, ids = part.partition(":")
        if name not in slots:
            raise InputError(
                f"--include names '{name}', which is not in the hostfile",
                f"use one of: {', '.join(slots)}",
            )
        for sid in filter(None, ids.split(",")):
            if not sid.isdigit() or int(sid) >= slots[name]:
                raise InputError(
                    f"--include slot '{sid}' on '{name}' is not in 0..{slots[name] - 1}",
                    "DeepSpeed needs every chosen slot < slots in the hostfile",
                )


def deepspeed_cmd(
    prog: Program, nodes, master: tuple[str, int], launcher="pdsh", ssh_port=None, include=None
) -> list[str]:
    """`<venv>/bin/deepspeed -H {hostfile} --launcher L --master_addr A --master_port P
    [--ssh_port N] [--include I] script args`, MASTER = (A, P); run on node 0 from the job
    directory."""
    nodes = _check_nodes(nodes)
    if launcher not in DEEPSPEED_LAUNCHERS:
        raise InputError(
            f"unknown DeepSpeed launcher '{launcher}'",
            f"use one of: {', '.join(DEEPSPEED_LAUNCHERS)}",
        )
    master_addr, master_port = master
    if not master_addr:  # DeepSpeed's default (`hostname -I` on node 0) often picks the wrong NIC
        raise InputError(
            "no master address for the DeepSpeed launcher",
            "pass node 0's address on the training network",
        )
    # the entry point beside the interpreter: the runner then re-execs that same
    # sys.executable on every node, which is why every node needs the same venv path
    argv = [
        str(PurePosixPath(prog.python).parent / "deepspeed"),
        "-H",
        HOSTFILE,
        "--launcher",
        launcher,
        "--master_addr",
        str(master_addr),
        "--master_port",
        str(int(master_port)),
    ]
    port = _common_port(nodes, ssh_port, "the DeepSpeed launcher")
    if port != 22:
        argv += ["--ssh_port", str(port)]
    if include:
        _check_include(include, nodes)
        argv += ["--include", include]
    return argv + _script_argv(prog)


def _endpoint(text: str) -> tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(
            f"rendezvous endpoint '{text}' is not HOST:PORT",
            "e.g. 10.200.0.10:29500 (node 0's address on the training network)",
        )
    return host, int(port)


def torchrun_cmd(
    prog: Program, nnodes, nproc_per_node, rdzv: tuple[str, str], max_restarts=0, node_rank=None
) -> list[str]:
    """`python -m torch.distributed.run` with c10d rendezvous, RDZV = (HOST:PORT endpoint,
    job id); the same argv on every node (node_rank only if given: c10d assigns ranks itself
    and ignores it)."""
    for what, value in (("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if not isinstance(value, int) or value < 1:
            raise InputError(f"torchrun {what}={value!r}", "must be a whole number >= 1")
    rdzv_endpoint, rdzv_id = rdzv
    _endpoint(rdzv_endpoint)
    if not rdzv_id or re.search(r"\s", str(rdzv_id)):
        raise InputError(
            f"rendezvous id {rdzv_id!r} is empty or has spaces",
            "use one job id, the same on every node",
        )
    argv = [
        str(prog.python),
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id}",
    ]
    if max_restarts:
        argv.append(f"--max-restarts={int(max_restarts)}")
    if node_rank is not None:
        argv.append(f"--node-rank={int(node_rank)}")
    return argv + _script_argv(prog)


def _env_names(names) -> list[str]:
    out = []
    for name in names:
        if not _ENV_NAME.match(str(name)):
            # names only: a NAME=VALUE here would put the value (maybe a secret) on the
            # command line, visible in ps and in launch logs
            raise InputError(
                f"'{name}' is not an environment variable name",
                "pass names; the values come from the launching shell",
            )
        if name not in out:
            out.append(name)
    return out


def mpirun_cmd(prog: Program, nodes, master: tuple[str, int], env_names, iface=None) -> list[str]:
    """Open MPI `mpirun -np TOTAL -H n1:s1,... -x ... python -u script args`, MASTER =
    (MASTER_ADDR, MASTER_PORT); ranks read OMPI_COMM_WORLD_*; IFACE (`eth0`, `=eth0` or
    `^docker0,lo`) pins MPI's TCP traffic."""
    nodes = _check_nodes(nodes)
    master_addr, master_port = master
    if not master_addr:
        raise InputError("no master address for mpirun", "pass node 0's address")
    total = sum(n.slots for n in nodes)
    argv = [
        "mpirun",
        "-np",
        str(total),
        "-H",
        ",".join(f"{n.name}:{n.slots}" for n in nodes),
        "-x",
        f"MASTER_ADDR={master_addr}",
        "-x",
        f"MASTER_PORT={int(master_port)}",
    ]
    for name in _env_names(["PATH", "LD_LIBRARY_PATH", *env_names]):
        if name not in ("MASTER_ADDR", "MASTER_PORT"):
            argv += ["-x", name]
    # ob1 + no openib: the defaults probe verbs hardware and warn or hang without it
    argv += ["-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    port = _common_port(nodes, None, "mpirun")
    if port != 22:
        argv += ["-mca", "plm_rsh_args", f"-p {port}"]
    if iface:
        iface = iface.lstrip("=")
        if iface.startswith("^"):
            # Open MPI wants loopback in any exclude list it is given
            names = [x for x in iface[1:].split(",") if x]
            names += [] if "lo" in names else ["lo"]
            argv += [
                "-mca",
                "btl_tcp_if_exclude",
                ",".join(names),
                "-mca",
                "oob_tcp_if_exclude",
                ",".join(names),
            ]
        else:  # oob too: the daemons' call-back to mpirun can also pick the wrong NIC
            argv += ["-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface]
    return argv + [*prog.prefix, str(prog.python), "-u", *_script_argv(prog)]


def srun_cmd(prog: Program, nodes, gpus_per_node, env) -> list[str]:
    """`srun --nodes N --nodelist L --ntasks-per-node G --kill-on-bad-exit=1 --label
    --export=ALL,K=V,... python -u script args`, inside an allocation or making one; ranks read
    SLURM_*; --label: every line says which task (rank) printed it, as pdsh names the node."""
    nodes = _check_nodes(nodes)
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise InputError(f"gpus_per_node={gpus_per_node!r}", "must be a whole number >= 1")
    exports = ["ALL"]
    for key, value in env.items():
        if not _ENV_NAME.match(str(key)):
            raise InputError(f"'{key}' is not an environment variable name")
        if "," in str(value) or "\n" in str(value):
            # --export splits on commas; there is no escape for one inside a value
            raise InputError(
                f"{key}={value!r} cannot pass through srun --export",
                "values must not contain ',' or newlines: set it in the job "
                "environment instead (srun exports ALL)",
            )
        exports.append(f"{key}={value}")
    # kill-on-bad-exit: one failed rank ends the step instead of leaving peers hanging
    return [
        "srun",
        "--nodes",
        str(len(nodes)),
        "--nodelist",
        nodeset.fold([n.name for n in nodes]),
        "--ntasks-per-node",
        str(gpus_per_node),
        "--kill-on-bad-exit=1",
        "--label",
        "--export=" + ",".join(exports),
        *prog.prefix,
        str(prog.python),
        "-u",
        *_script_argv(prog),
    ]


def srun_line_node(line: str, names: list[str], per_node: int) -> str | None:
    """The node that printed LINE under `srun --label --ntasks-per-node PER_NODE` over NAMES:
    task t runs on node t // PER_NODE (srun's default block distribution); None when the line
    carries no task label (srun's own messages)."""
    m = re.match(r"\s*(\d+): ", line)
    if not m or per_node < 1:
        return None
    i = int(m.group(1)) // per_node
    return names[i] if i < len(names) else None
