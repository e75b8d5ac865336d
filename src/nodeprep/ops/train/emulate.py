"""`train --emulate M`: one machine as M nodes (ssh aliases emu-0.. to itself), its GPUs split
between them, so multi-node launch paths can be tried on a single box."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from nodeprep.engine.facts import FILE, gather
from nodeprep.engine.hostkeys import host_entry
from nodeprep.engine.remote import write_script
from nodeprep.engine.steps import with_block
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.ssh import CLUSTER_KEY
from nodeprep.ops.train import gpusplit

EMU_PREFIX = "emu-"
EMU_BLOCK = "emulated nodes"


@dataclass
class Emulation:
    """One machine as M nodes: ssh aliases EMU_PREFIX0.. to it, per-node slots and GPUs."""

    machine: str
    names: list[str]
    per_node: int  # processes per emulated node
    _: KW_ONLY
    hostfile_slots: list[int]  # what the hostfile says (all K GPUs with --include)
    devices: list[list[int]] | None  # GPUs of each emulated node (None: CPU)
    include: str | None
    cuda_visible: list[str]
    network: bool

    def describe(self) -> str:
        if self.devices:
            share = ", ".join(
                f"{n}: GPU {','.join(map(str, d))}" for n, d in zip(self.names, self.devices)
            )
        else:
            share = f"no GPU: {self.per_node} CPU process each"
        return f"emulating {len(self.names)} nodes on {self.machine} ({share})" + (
            "; NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" if self.network else ""
        )


def check_emulate(m, hosts, launcher) -> None:
    if not isinstance(m, int) or m < 1:
        raise InputError(f"--emulate {m!r}: expected a number of nodes >= 1")
    if len(hosts) != 1:
        raise InputError(
            f"--emulate makes ONE machine look like {m} nodes, but {len(hosts)} nodes are selected",
            hint="pick the machine with --limit NODE",
        )
    if launcher == "srun":
        raise InputError(
            "--emulate with srun: Slurm places tasks itself",
            hint="use --launcher deepspeed, torchrun or mpirun",
        )


def emulation_of(host, m: int, gpus: int, launcher: str, network: bool) -> Emulation:
    names = [f"{EMU_PREFIX}{k}" for k in range(m)]
    if not gpus:  # a CPU machine: one process per emulated node, nothing to split
        return Emulation(
            host.name,
            names,
            1,
            hostfile_slots=[1] * m,
            devices=None,
            include=None,
            cuda_visible=[],
            network=network,
        )
    if launcher == "mpirun":
        raise InputError(
            f"--emulate with mpirun on {host.name}'s {gpus} GPU(s): Open MPI gives every "
            "emulated node local ranks from 0, so they would share GPUs",
            hint="use --launcher deepspeed (--include) or torchrun (CUDA_VISIBLE_DEVICES)",
        )
    e = gpusplit.emulated(gpus, m, prefix=EMU_PREFIX)
    return Emulation(
        host.name,
        e["names"],
        e["slots"][0],
        hostfile_slots=[gpus] * m,
        devices=e["devices"],
        include=e["include"],
        cuda_visible=e["cuda_visible"],
        network=network,
    )


def alias_block(emu: Emulation, host) -> str:
    """~/.ssh/config entries for the emulated nodes: this machine's address and port, the
    cluster key, and the machine's own pinned host key (HostKeyAlias = the name its key is
    recorded under in ~/.ssh/known_hosts by provision's ssh mesh): no new trust is added."""
    return (
        f"Host {' '.join(emu.names)}\n    HostName {host.address}\n    Port {host.port}\n"
        f"    HostKeyAlias {host_entry(host.name, host.port)}\n"
        f"    IdentityFile {CLUSTER_KEY}\n    IdentitiesOnly yes\n"
    )


def write_aliases(session, emu: Emulation, host) -> bool:
    """Put the alias block into the machine's ~/.ssh/config (atomically, other content kept);
    False when it was already there."""
    f = gather(session, [FILE("~/.ssh/config")])[FILE("~/.ssh/config")]
    if f["exists"] and f["content"] is None:
        raise NodeprepError(f"{host.name}: ~/.ssh/config is too big to manage")
    new = with_block(f["content"], EMU_BLOCK, alias_block(emu, host))
    if new == f["content"] and f["mode"] == 0o600:
        return False
    r = session.run(
        write_script("~/.ssh/config", new, 0o600), label="write ssh aliases", log_output=False
    )
    if not r.ok:
        raise NodeprepError(f"{host.name}: cannot write ~/.ssh/config: {r.tail(3)}")
    return True
