"""One node's NVLink, from GPU_DETAIL's `nvidia-smi nvlink -s` and FABRIC: every link up on
every GPU, judged against what the hardware says (NVSwitches, a GPU's fabric state, an SXM
module) or, without that, against the node's other GPUs. Returns [(code, verdict, reason,
fix)], as gpu.py's checks do."""

from __future__ import annotations

from nodeprep.engine.facts.gpuhealth import FABRIC, GPU_DETAIL, SMI_TIMEOUT
from nodeprep.ops.health.findings import Context, Verdict
from nodeprep.ops.health.gpu import RESET, _gpus

WARN = Verdict.WARN
UNKNOWN = Verdict.UNKNOWN
CRITICAL = Verdict.CRITICAL

_BRIDGE = "; if it stays down, check the NVLink bridge or baseboard"
_NVLINK_BY_HAND = (
    "read `nvidia-smi nvlink -s` on the node by hand; a new shape of its output belongs in "
    "nodeprep's parse_nvlink (engine/facts/gpuhealth.py) with a case in tests/facts/gpu_detail/"
)


def _nvlink_hardware(f, per: dict) -> str | None:
    """Why the node must have NVLink up (NVSwitches, a GPU's fabric state, an SXM module whose
    links are on the baseboard), or None: PCIe cards with bridge connectors may have no bridge."""
    fab, gpus = f[FABRIC], _gpus(f) or []
    if fab["nvswitches"]:
        return f"{fab['nvswitches']} NVSwitch(es)"
    states = sorted({g["fabric_state"] for g in gpus if g.get("fabric_state")})
    if states:
        return f"GPU fabric state {', '.join(states)}"
    names = [g["name"] for g in gpus] + [v.get("name") or "" for v in per.values()]
    sxm = sorted({n for n in names if "SXM" in n.upper()})
    return f"{sxm[0]} is an SXM module" if sxm else None


def _nvlink_unread(d: dict, per: dict) -> list:
    """What nvlink -s did not let the checks see: a failure, lines not understood, MIG."""
    out = []
    if d["state"] == "error":
        out.append(
            (
                "NVLINK_UNKNOWN",
                UNKNOWN,
                f"nvidia-smi nvlink -s failed: {(d.get('error') or '?')[:200]}",
                "run `nvidia-smi nvlink -s` on the node; "
                "a GPU whose handle is lost needs a reset or a reboot",
            )
        )
    elif d.get("unknown"):
        out.append(
            (
                "NVLINK_UNKNOWN",
                UNKNOWN,
                f"nvidia-smi nvlink -s printed what nodeprep does not read (first: "
                f"{d['unknown'][0]!r}): the links it is about are not judged",
                _NVLINK_BY_HAND,
            )
        )
    mig = sorted(int(i) for i, v in per.items() if v.get("status") == "mig")
    if mig:
        out.append(
            (
                "NVLINK_MIG",
                UNKNOWN,
                f"GPU {', '.join(map(str, mig))}: NVLink state not readable in MIG mode "
                "(NVML: Nvlink queries are not supported for Devices in MIG mode)",
                "MIG instances use no NVLink peer traffic: --ignore NVLINK_MIG on MIG nodes; "
                "to check the links, disable MIG at a drain "
                "(`sudo nvidia-smi -i N -mig 0`, then reset the GPU)",
            )
        )
    return out


def _nvlink_none_up(linked: dict, hw: str | None, n: int) -> list:
    """No GPU of the node has an active link: the fabric is down where the hardware says NVLink
    must be up; else a bridge may simply not be fitted (WARN); one GPU alone has nothing to link."""
    dead = sorted(i for i, v in linked.items() if v["status"] == "all_inactive" or v["inactive"])
    if not dead:
        return []
    which = ", ".join(map(str, dead))
    if hw:
        return [
            (
                "NVLINK_DOWN",
                CRITICAL,
                f"no NVLink link up on any GPU (GPU {which}: all inactive) although {hw}: "
                "the node's NVLink fabric is down, collectives fall back to PCIe",
                "check nvidia-fabricmanager (the fabric_manager check), the NVSwitches and the "
                "kernel log (SXid, Xid 74); reset the GPUs or reboot the node; "
                "if it stays down, the baseboard needs service",
            )
        ]
    if n > 1:
        return [
            (
                "NVLINK_NONE",
                WARN,
                f"no NVLink link up on GPU {which} (NVML: all links are inactive): no bridge "
                "fitted, or every bridge down (no NVSwitch, fabric state or SXM module says which)",
                "if the GPUs should be bridged, reseat the NVLink bridges; "
                "a node without bridges: --ignore NVLINK_NONE",
            )
        ]
    return []


def _nvlink_down(linked: dict, hw: str | None, most: int) -> list:
    """GPUs with inactive links while others have MOST active: one cut off (all inactive),
    or with fewer active links than the others (or any inactive, where HW says NVLink must be
    up)."""
    out = []
    for i, v in sorted(linked.items()):
        if v.get("status") == "all_inactive":
            out.append(
                (
                    "NVLINK_DOWN",
                    CRITICAL,
                    f"GPU {i}: every NVLink link inactive (NVML: all links are "
                    f"inactive) while the node's other GPUs have {most} active: "
                    "it is cut off from NVLink",
                    RESET.format(i=i) + _BRIDGE,
                )
            )
        elif v["inactive"] and (
            hw or v["active"] + v.get("unread", 0) < most
        ):  # an unread line may be a link
            than = (
                f"the node's other GPUs have {most}"
                if v["active"] < most
                else f"{hw}: every link should be up"
            )
            out.append(
                (
                    "NVLINK_DOWN",
                    CRITICAL,
                    f"GPU {i}: NVLink link(s) {', '.join(map(str, v['inactive']))} "
                    f"inactive ({v['active']} active, {than})",
                    RESET.format(i=i) + _BRIDGE,
                )
            )
    return out


def nvlink(f, ctx: Context) -> list:
    d = f[GPU_DETAIL]["nvlink"]
    if _gpus(f) is None or d["state"] == "absent":
        return []
    if d["state"] == "hung":
        return [
            (
                "NVLINK_UNKNOWN",
                UNKNOWN,
                f"nvidia-smi nvlink -s did not answer within {SMI_TIMEOUT} s",
                "reset the GPUs or reboot the node",
            )
        ]
    per = d["gpus"]
    out, hw = _nvlink_unread(d, per), _nvlink_hardware(f, per)
    linked = {
        int(i): v for i, v in per.items() if v.get("status", "links") in ("links", "all_inactive")
    }
    most = max((v["active"] for v in per.values()), default=0)
    if most == 0:
        return out + _nvlink_none_up(linked, hw, len(per))
    out += _nvlink_down(linked, hw, most)
    silent = sorted(int(i) for i, v in per.items() if v.get("status") == "silent")
    if silent:
        out.append(
            (
                "NVLINK_UNKNOWN",
                UNKNOWN,
                f"GPU {', '.join(map(str, silent))}: nvidia-smi nvlink -s printed no "
                f"link state for it while the node's other GPUs have {most} active links",
                _NVLINK_BY_HAND,
            )
        )
    return out
