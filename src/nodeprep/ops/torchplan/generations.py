"""Step 1 of the torch plan (plan.py), before any wheel is looked at: every node's GPU facts
are usable (nvidia-smi answered, capabilities and driver known, no GPU-less node among GPU
nodes unless cpu_only), and every GPU's generation runs on its own node's driver (Blackwell
needs R570+, Kepler ends at R470). A node that fails either is a PlanError naming it."""

from __future__ import annotations

import re

from nodeprep.ops.torchplan import data as td
from nodeprep.ops.torchplan.nodes import NodeGPU
from nodeprep.ops.torchplan.rule import PlanError, PlatformGroups


def check_nodes(nodes: list[NodeGPU]) -> None:
    for n in (n for n in nodes if n.error and not n.cpu_only):
        raise PlanError(
            n.name,
            f"nvidia-smi failed, driver not loaded? ({n.error[:100]})",
            "load the NVIDIA driver so nvidia-smi lists the GPUs, or mark it cpu_only: true",
        )
    has_gpus = any(n.capabilities and not n.cpu_only for n in nodes)
    for n in nodes:
        if has_gpus and not n.cpu_only and not n.capabilities:
            raise PlanError(
                n.name,
                "has no GPU while other nodes have",
                "mark it cpu_only: true or fix its driver",
            )
        for i, cap in enumerate(n.capabilities if not n.cpu_only else []):
            if not re.fullmatch(r"\d+\.\d+", cap or ""):
                model = n.models[i] if i < len(n.models) else "a GPU"
                raise PlanError(
                    n.name,
                    f"compute capability of {model} unknown",
                    "add the model to src/nodeprep/engine/facts/gpu_capabilities.yml",
                )
        if n.capabilities and not n.cpu_only and not re.match(r"\d+", n.driver or ""):
            raise PlanError(
                n.name, f"driver version unknown ({n.driver!r})", "check nvidia-smi on the node"
            )


def check_generations(fl: PlatformGroups, why: list[str], today) -> None:
    """Step 1: a GPU its own driver cannot run is refused before any wheel is looked at."""
    seen = set()
    for n in fl.gpu_nodes:
        for i, cap in enumerate(n.capabilities):
            g = td.generation(cap, n.arch)
            if not g or (n.name, g["name"], cap) in seen:
                continue
            seen.add((n.name, g["name"], cap))
            model = n.models[i] if i < len(n.models) and n.models[i] else "GPU"
            label = f"{model} (sm_{cap.replace('.', '')}, {g['name']})"
            floor, top = g.get("min_driver"), g.get("max_branch")
            if not g.get("confirmed", True):
                why.append(
                    f"   {label} on {n.name}: {g['name']} needs {g.get('branch')}+ ({g['note']})"
                )
                continue
            src = td.cite(td.sources(g.get("source")))
            if g.get("not_served"):
                why.append(f"   {label} on {n.name}: not an sbsa target {src}")
                raise PlanError(
                    n.name,
                    f"{label} is not served by PyTorch's {n.arch} CUDA wheels ({g['name']}/L4T "
                    "is not an sbsa target)",
                    "install NVIDIA's JetPack build of torch on it (nodeprep "
                    "plans PyTorch's index only), or mark it cpu_only: true",
                )
            if floor and td.ver(n.driver) < td.ver(floor):
                why.append(
                    f"   {label} on {n.name}: needs driver >= {floor} {src}: {n.driver} is older"
                )
                raise PlanError(
                    n.name,
                    f"{label} needs driver >= {floor} ({g['branch']} or newer); it has {n.driver}",
                    f"install {td.driver_advice(floor, today)}; no torch build helps before that",
                )
            if top and td.branch_of(n.driver) > int(top[1:]):
                why.append(
                    f"   {label} on {n.name}: supported up to {top} {src}: {n.driver} is newer"
                )
                raise PlanError(
                    n.name,
                    f"{label} is supported by drivers up to the {top} branch; it has {n.driver}",
                    f"no supported driver branch runs {g['name']} GPUs ({top} was "
                    f"the last): run it on an {top} driver outside NVIDIA's support, "
                    "or use newer GPUs",
                )
            need = f">= {floor} ({g['branch']})" if floor else f"<= {top}"
            why.append(f"   {label} on {n.name}: needs driver {need} {src}: {n.driver} ok")
