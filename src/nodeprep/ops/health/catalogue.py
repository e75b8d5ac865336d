"""Every check by name, with the codes it can give and its sources (`invoke health
--list-checks` prints this), and the selection that --check and --ignore make."""

from __future__ import annotations

from nodeprep.engine.facts.modules import MODULES
from nodeprep.errors import InputError
from nodeprep.ops.health import deep, fleet, gpu, node, nvlink
from nodeprep.ops.health.findings import CheckSpec

_AZ = "azurehpc-health-checks"
CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec(
        "nvidia_smi",
        "nvidia-smi answers in time, on every node with NVIDIA devices",
        codes={
            "SMI_OK": "answered",
            "NO_GPUS": "a node without NVIDIA GPUs",
            "SMI_MISSING": "devices, no nvidia-smi",
            "SMI_HUNG": "no answer within 15 s",
            "SMI_ERROR": "nvidia-smi failed",
        },
        facts=gpu.FACTS,
        run=gpu.nvidia_smi,
        source="DCGM diag level 1 (NVML answers); Imbue cluster-health (timeouts are UNKNOWN)",
    ),
    CheckSpec(
        "gpu_count",
        "as many GPUs as the fleet's other nodes of that model",
        codes={"GPU_COUNT": "fewer GPUs than the best node of the same model"},
        facts=fleet.FACTS,
        run=fleet.gpu_count,
        fleet=True,
        source=f"{_AZ} (GPU count)",
    ),
    CheckSpec(
        "persistence",
        "persistence mode on",
        codes={"PERSISTENCE_OFF": "off on some GPU"},
        facts=gpu.FACTS,
        run=gpu.persistence,
        source="DCGM diag level 1",
    ),
    CheckSpec(
        "ecc",
        "no uncorrected ECC errors; corrected under the threshold; ECC mode as it will stay",
        codes={
            "ECC_UNCORRECTED": "uncorrected errors (volatile or SRAM)",
            "ECC_CORRECTED": "corrected over 1000",
            "ECC_MODE_PENDING": "the mode changes at the next reset",
        },
        facts=gpu.FACTS,
        run=gpu.ecc,
        source=f"{_AZ} (SRAM uncorrected: any); Imbue (0 uncorrected)",
    ),
    CheckSpec(
        "ecc_mode",
        "ECC mode equal across the fleet",
        codes={"ECC_MODE_MISMATCH": "differs from most nodes"},
        facts=fleet.FACTS,
        run=fleet.ecc_mode,
        fleet=True,
        source="Imbue cluster-health (golden config)",
    ),
    CheckSpec(
        "row_remap",
        "no row remap pending (reset) or failed (RMA)",
        codes={"REMAP_PENDING": "needs a GPU reset", "REMAP_FAILED": "RMA"},
        facts=gpu.FACTS,
        run=gpu.row_remap,
        source=f"{_AZ}; NVIDIA A100/H100 row remapping docs",
    ),
    CheckSpec(
        "retired_pages",
        "no page retirement pending; few retired pages",
        codes={"RETIRED_PENDING": "needs a GPU reset", "RETIRED_MANY": "10 or more retired"},
        facts=gpu.FACTS,
        run=gpu.retired_pages,
        source="NVIDIA dynamic page retirement docs; Meta GCM (10 pages)",
    ),
    CheckSpec(
        "pcie",
        "PCIe link at the device's width (and gen when busy); no 'limited by' kernel line",
        codes={
            "PCIE_WIDTH": "narrower than the device's max",
            "PCIE_GEN": "slower gen while busy",
            "PCIE_LIMITED": "the kernel says the link limits it",
        },
        facts=gpu.FACTS,
        run=gpu.pcie,
        source="Imbue ('PCIe limited' in dmesg); IBM Autopilot (PCIe bandwidth)",
    ),
    CheckSpec(
        "clock_events",
        "no hardware slowdown, thermal or power brake holding the clocks",
        codes={
            "CLOCK_HW_SLOWDOWN": "HW slowdown / HW thermal / power brake",
            "CLOCK_SW_THERMAL": "SW thermal",
        },
        facts=gpu.FACTS,
        run=gpu.clock_events,
        source=f"{_AZ} (throttling); NVML clocks_event_reasons",
    ),
    CheckSpec(
        "nvlink",
        "every NVLink link up on every GPU (nvidia-smi nvlink -s)",
        codes={
            "NVLINK_DOWN": "inactive links, a GPU cut off (all links inactive), "
            "or no link up where NVSwitches, a fabric state or an SXM module say NVLink must be",
            "NVLINK_NONE": "no link up on any GPU, nothing says a bridge is fitted (WARN)",
            "NVLINK_MIG": "not readable in MIG mode (UNKNOWN)",
            "NVLINK_UNKNOWN": "nvlink -s hung, failed, or printed what nodeprep does not read",
        },
        facts=gpu.FACTS,
        run=nvlink.nvlink,
        source=f"{_AZ} (NVLink inactive, all links inactive); Imbue",
    ),
    CheckSpec(
        "mig_mode",
        "MIG mode equal across the fleet",
        codes={"MIG_MISMATCH": "differs from most nodes"},
        facts=fleet.FACTS,
        run=fleet.mig_mode,
        fleet=True,
        source="Imbue (golden config)",
    ),
    CheckSpec(
        "gpu_busy",
        "no other process on the GPUs",
        codes={"GPU_BUSY": "a compute process holds a GPU"},
        facts=gpu.FACTS,
        run=gpu.busy,
        source="Google cluster-health-scanner prolog",
    ),
    CheckSpec(
        "xid",
        "no hardware Xid in the kernel log in the window (2 h); application Xids listed",
        codes={
            "XID_HW": "a hardware Xid",
            "XID_WARN": "an Xid that needs watching",
            "XID_APP": "an application's Xid",
            "GPU_OFF_BUS": "'fallen off the bus' without an Xid line",
            "KLOG_UNREADABLE": "the kernel log cannot be read",
        },
        facts=gpu.FACTS,
        run=gpu.xid,
        source=f"NVIDIA Xid table; {_AZ} (last 2 h); Imbue",
    ),
    CheckSpec(
        "fabric_manager",
        "nvidia-fabricmanager runs where NVSwitches are; fabric state Completed",
        codes={
            "FABRIC_MANAGER_DOWN": "NVSwitches without the fabric manager",
            "FABRIC_NOT_READY": "fabric state",
        },
        facts=gpu.FACTS,
        run=gpu.fabric_manager,
        source="Imbue cluster-health (fabric manager)",
    ),
    CheckSpec(
        "disk",
        "room in the home, /tmp and ~/.nodeprep",
        codes={
            "DISK_FULL": "under 1 GiB or no inodes",
            "DISK_LOW": "under 5 GiB or 95% used",
            "DISK_READONLY": "read-only or not writable",
        },
        facts=node.FACTS,
        run=node.disk,
        source="Imbue (95%)",
    ),
    CheckSpec(
        "memory",
        "memory available",
        codes={"MEM_LOW": "under 1 GiB (CRITICAL) or 10% (WARN)"},
        facts=node.FACTS,
        run=node.memory,
    ),
    CheckSpec(
        "shm",
        "/dev/shm of 512 MiB or more",
        codes={"SHM_SMALL": "under 512 MiB", "SHM_MISSING": "none"},
        facts=node.FACTS,
        run=node.shm,
        source="DeepSpeed ds_report (512 MiB); NCCL troubleshooting (Docker's 64 MB)",
    ),
    CheckSpec(
        "modules",
        "every environment module the inventory names loads (where it names any)",
        codes={
            "MODULES_OK": "they load",
            "MODULE_NOT_LOADED": "one does not (what the node has instead, and the fix)",
            "MODULES_NO_SYSTEM": "no module system defines `module`",
        },
        facts=(MODULES,),
        run=node.modules,
        source="nodeprep (issue 46): what seed 003's job script does first (module load)",
    ),
    CheckSpec(
        "limits",
        "locked memory unlimited where RDMA ports are, open files 4096 or more",
        codes={
            "MEMLOCK_LOW": "memlock limited on a node with RDMA",
            "NOFILE_LOW": "open files under 4096",
        },
        facts=node.FACTS,
        run=node.limits,
        source="NCCL and AWS EFA docs (ulimit -l unlimited)",
    ),
    CheckSpec(
        "limits_equal",
        "locked memory and open files no lower than most nodes'",
        codes={
            "MEMLOCK_BELOW_FLEET": "memlock below the fleet's",
            "NOFILE_BELOW_FLEET": "open files below the fleet's",
        },
        facts=fleet.FACTS,
        run=fleet.limits_equal,
        fleet=True,
        source="a node without the others' limits.d line",
    ),
    CheckSpec(
        "clock",
        "clock within 1 s of the controller's; a time-sync daemon runs",
        codes={
            "CLOCK_OFFSET": "over 1 s (WARN) or 30 s (CRITICAL)",
            "TIME_SYNC": "no sync daemon",
            "CLOCK_UNKNOWN": "time unreadable",
        },
        facts=node.FACTS,
        run=node.clock,
    ),
    CheckSpec(
        "rdma",
        "InfiniBand/RoCE/EFA ports ACTIVE and at the fleet's rate",
        codes={
            "RDMA_PORT_DOWN": "a port down that is ACTIVE elsewhere",
            "RDMA_RATE": "below the fleet's rate",
            "RDMA_MISSING": "a device the others have",
        },
        facts=fleet.FACTS,
        run=fleet.rdma,
        fleet=True,
        source=f"{_AZ} (IB rate); /sys/class/infiniband",
    ),
    CheckSpec(
        "net_link",
        "the job network's interface: speed and MTU equal across the fleet",
        codes={
            "NET_SPEED": "slower than the best node",
            "NET_MTU": "MTU differs",
            "NET_UNKNOWN": "no interface found",
        },
        facts=fleet.FACTS,
        run=fleet.net_link,
        fleet=True,
    ),
    # -- the deep tier (--deep, minutes) --
    CheckSpec(
        "dcgm_diag",
        "DCGM's diagnostic, level 2 (`dcgmi diag -r 2`: software, PCIe, memory; about 2 min)",
        codes={
            "DCGM_PASS": "every result passed",
            "DCGM_FAIL": "a test failed",
            "DCGM_WARN": "a test warned",
            "DCGM_MISSING": "no dcgmi on the node",
            "DCGM_HUNG": "no answer within 15 min",
            "DCGM_ERROR": "dcgmi gave no result",
        },
        facts=deep.FACTS,
        run=deep.dcgm,
        tier="deep",
        source="NVIDIA DCGM diagnostics (run levels 1-4); Meta GCM and Google CHS run it",
    ),
    CheckSpec(
        "gpu_burn",
        "every GPU multiplies the same fp32 matrices for 10 s: answers equal, speed even",
        codes={
            "BURN_OK": "all agree",
            "BURN_MISMATCH": "a GPU gave two answers to one product",
            "BURN_DISAGREE": "a GPU's answer differs from the others'",
            "BURN_SLOW": "under 0.8x its node's fastest",
            "BURN_ERROR": "the burn failed on a GPU",
            "DEEP_NO_TORCH": "no venv with torch",
            "DEEP_NO_CUDA": "torch sees no CUDA device",
            "DEEP_ERROR": "the GPU program failed",
            "DEEP_HUNG": "the GPU program did not finish in time",
        },
        facts=deep.FACTS,
        run=deep.burn,
        tier="deep",
        source="wilicc/gpu-burn (GEMM compare, 10 s default)",
    ),
    CheckSpec(
        "allreduce_node",
        "all_reduce over the node's GPUs (NCCL) at a large message against the model's floor",
        codes={
            "ALLREDUCE_OK": "at or over the floor",
            "ALLREDUCE_SLOW": "under the floor",
            "ALLREDUCE_WRONG": "a wrong sum",
            "ALLREDUCE_FAIL": "the all_reduce failed",
            "ALLREDUCE_NO_FLOOR": "measured; no floor for this model",
            "ALLREDUCE_NA": "one GPU",
        },
        facts=deep.FACTS,
        run=deep.allreduce,
        tier="deep",
        source="azurehpc-health-checks check_nccl_allreduce (floors.yml); nccl-tests busbw",
    ),
)

BY_NAME = {c.name: c for c in CHECKS}
# Codes the command itself gives: a node that does not answer, a check that could not read it.
COMMAND_CODES = {
    "NODE_UNREACHABLE": "the node did not answer (CRITICAL)",
    "CHECK_ERROR": "a check could not read the node's answer (UNKNOWN)",
    "QUARANTINED": "`train --restarts` took the node out of service (CRITICAL) until "
    "`invoke train.release --node NODE`",
}
CODES = {code: c.name for c in CHECKS for code in c.codes} | {c: "health" for c in COMMAND_CODES}


def select(names: tuple[str, ...] = (), deep: bool = False) -> tuple[CheckSpec, ...]:
    """The checks named, or else every passive check (and the deep tier's with DEEP); an
    unknown name is a bad input. Naming a deep check runs it: the name says what is wanted."""
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise InputError(
            f"no health check named {', '.join(map(repr, unknown))}",
            hint=f"`invoke health --list-checks` lists them: {', '.join(BY_NAME)}",
        )
    if names:
        return tuple(BY_NAME[n] for n in names)
    return tuple(c for c in CHECKS if deep or c.tier == "passive")


def check_ignored(codes: tuple[str, ...]) -> None:
    unknown = [c for c in codes if c not in CODES]
    if unknown:
        raise InputError(
            f"--ignore: no finding code {', '.join(map(repr, unknown))}",
            hint="`invoke health --list-checks` lists every code",
        )


def facts_of(checks) -> list:
    """The fact requests the selected checks read, each once, in order."""
    seen, out = set(), []
    for c in checks:
        for f in c.facts:
            key = getattr(f, "key", None)
            if key not in seen:
                seen.add(key)
                out.append(f)
    return out
