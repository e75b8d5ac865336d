"""One machine's GPUs split evenly between nodes, the one rule for both cases that need it:
inventory nodes that are one machine (the single-box recipe, a big box split in partitions)
and `train --emulate M` (one machine as M nodes). Node k of M gets GPUs [k*K/M, (k+1)*K/M),
so no two share a GPU. DeepSpeed is told the split with `--include` (its slot ids are physical
GPU ids, each below the hostfile's slots: so such a node's hostfile line gives it ALL of its
machine's GPUs), torchrun with CUDA_VISIBLE_DEVICES per node."""

from __future__ import annotations

from nodeprep.errors import InputError
from nodeprep.inventory.nodeset import fold


def split(gpus: int, nodes: int) -> list[list[int]]:
    """GPUs [k*K/M, (k+1)*K/M) for node k of M; K must be a multiple of M (callers say why
    it is not, in their own words)."""
    per = gpus // nodes
    return [list(range(k * per, (k + 1) * per)) for k in range(nodes)]


def include(names: list[str], devices: list) -> str:
    """DeepSpeed's --include: `n0:0,1@n1:2,3` (node: its physical GPU ids)."""
    return "@".join(f"{n}:{','.join(map(str, d))}" for n, d in zip(names, devices))


def visible(devices: list) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each node ("0,1", "2,3")."""
    return [",".join(map(str, d)) for d in devices]


def emulated(gpus: int, nodes: int, prefix: str = "worker-") -> dict:
    """K GPUs of one machine as M emulated nodes PREFIX0..: returns names, slots, devices,
    include, cuda_visible and the hostfile (every emulated node lists all K GPUs)."""
    if not isinstance(gpus, int) or not isinstance(nodes, int) or gpus < 1 or nodes < 1:
        raise InputError(
            f"cannot emulate {nodes} node(s) on {gpus} GPU(s)", "both must be whole numbers >= 1"
        )
    if nodes > gpus:
        raise InputError(
            f"cannot emulate {nodes} nodes on {gpus} GPU(s): a node needs at "
            "least one GPU of its own",
            f"use at most {gpus} nodes",
        )
    if gpus % nodes:
        raise InputError(
            f"{gpus} GPUs do not split evenly over {nodes} nodes",
            "pick a node count that divides the GPU count (all nodes must have "
            "the same number of GPUs)",
        )
    names = [f"{prefix}{k}" for k in range(nodes)]
    devices = split(gpus, nodes)
    return {
        "names": names,
        "slots": [gpus // nodes] * nodes,
        "devices": devices,
        "include": include(names, devices),
        "cuda_visible": visible(devices),
        "hostfile": "".join(f"{n} slots={gpus}\n" for n in names),
    }


def machine_shares(
    by_machine_id: dict[str, list[str]], names: list[str], gpus: dict[str, int]
) -> dict[str, list[int]]:
    """BY_MACHINE_ID: machine id -> its inventory nodes (Topology.by_machine_id). The selected NAMES
    on one machine split its GPUs; nodes alone on their machine, or on a machine without GPUs, are
    not in the answer (they use them all)."""
    out: dict[str, list[int]] = {}
    for nodes in by_machine_id.values():
        sel = [n for n in nodes if n in names]
        k_gpus = gpus.get(sel[0], 0) if sel else 0
        if len(sel) < 2 or not k_gpus:
            continue
        if k_gpus % len(sel):
            raise InputError(
                f"{fold(sel)} are one machine with {k_gpus} GPU(s), which do not split "
                f"evenly over {len(sel)} nodes",
                hint="select a number of its nodes that divides its GPU count (--limit)",
            )
        out.update(zip(sel, split(k_gpus, len(sel))))
    return out
