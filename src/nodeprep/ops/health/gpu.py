"""The checks of one node's GPUs, from GPU_DETAIL (nvidia-smi -q -x and nvlink -s), KERNEL_LOG and
FABRIC. Each returns [(code, verdict, reason, fix)]; a node without GPUs gets nothing here
(the fleet's GPU count check, in fleet.py, names a node that should have them)."""

from __future__ import annotations

from nodeprep.engine.facts.gpuhealth import FABRIC, GPU_DETAIL, SMI_TIMEOUT
from nodeprep.engine.facts.kernellog import KERNEL_LOG
from nodeprep.ops.health import xids
from nodeprep.ops.health.findings import Context, Verdict

OK = Verdict.OK
WARN = Verdict.WARN
UNKNOWN = Verdict.UNKNOWN
CRITICAL = Verdict.CRITICAL
RESET = "drain the node, then `sudo nvidia-smi -r -i {i}` (or reboot)"


def _gpus(f) -> list[dict] | None:
    """The node's GPUs, or None when nvidia-smi gave nothing to judge."""
    d = f[GPU_DETAIL]
    return d["gpus"] if d["state"] == "ok" else None


def _label(g: dict) -> str:
    return f"GPU {g['index']} ({g['bus_id']})"


def nvidia_smi(f, ctx: Context) -> list:
    d = f[GPU_DETAIL]
    if d["state"] == "absent":
        if d.get("devices"):
            return [
                (
                    "SMI_MISSING",
                    UNKNOWN,
                    f"{d['devices']} NVIDIA device file(s) but no nvidia-smi on PATH",
                    "install the NVIDIA driver's utilities (nvidia-utils) "
                    "so nvidia-smi is on the login PATH",
                )
            ]
        return [("NO_GPUS", OK, "no NVIDIA GPU (no nvidia-smi, no /dev/nvidiaN)", "")]
    if d["state"] == "hung":
        return [
            (
                "SMI_HUNG",
                UNKNOWN,
                f"nvidia-smi -q -x did not answer within {SMI_TIMEOUT} s: the driver may be wedged",
                "look for Xid 79/119 in the kernel log; reset the GPUs or reboot the node",
            )
        ]
    if d["state"] == "error":
        return [
            (
                "SMI_ERROR",
                UNKNOWN,
                f"nvidia-smi failed: {d['error'][:200]}",
                "run nvidia-smi on the node; reload the NVIDIA driver or reboot",
            )
        ]
    n = len(d["gpus"])
    return [("SMI_OK", OK, f"{n} GPU(s), driver {d['driver']}, CUDA {d['cuda']}", "")]


def persistence(f, ctx: Context) -> list:
    gpus = _gpus(f)
    off = [g for g in gpus or [] if g["persistence"] is False]
    if off:
        return [
            (
                "PERSISTENCE_OFF",
                WARN,
                "persistence mode off on "
                + ", ".join(_label(g) for g in off)
                + ": every CUDA start re-initialises the GPU (seconds)",
                "run nvidia-persistenced (or `sudo nvidia-smi -pm 1`)",
            )
        ]
    return []


def ecc(f, ctx: Context) -> list:
    out = []
    for g in _gpus(f) or []:
        e, i = g["ecc"], g["index"]
        unc = [
            x
            for x in (
                (e["volatile_uncorrected"], "since the last reset"),
                (e["sram_uncorrected"], "in SRAM, over the GPU's life"),
            )
            if x[0]
        ]
        if unc or e["sram_threshold_exceeded"]:
            what = (
                "; ".join(f"{n} {when}" for n, when in unc) or "the SRAM error threshold exceeded"
            )
            out.append(
                (
                    "ECC_UNCORRECTED",
                    CRITICAL,
                    f"{_label(g)}: uncorrected ECC errors: {what}",
                    RESET.format(i=i) + "; if they come back, RMA the GPU",
                )
            )
        elif (e["volatile_corrected"] or 0) > ctx.thresholds.corrected_ecc_warn:
            out.append(
                (
                    "ECC_CORRECTED",
                    WARN,
                    f"{_label(g)}: {e['volatile_corrected']} corrected ECC errors since "
                    f"the last reset (over {ctx.thresholds.corrected_ecc_warn})",
                    "watch the count; reset the GPU at the next drain",
                )
            )
        if e["mode"] and e["pending_mode"] and e["mode"] != e["pending_mode"]:
            out.append(
                (
                    "ECC_MODE_PENDING",
                    WARN,
                    f"{_label(g)}: ECC {e['mode']} now, {e['pending_mode']} after a reset",
                    RESET.format(i=i),
                )
            )
    return out


def row_remap(f, ctx: Context) -> list:
    out = []
    for g in _gpus(f) or []:
        r = g["remap"]
        if r["failure"]:
            out.append(
                (
                    "REMAP_FAILED",
                    CRITICAL,
                    f"{_label(g)}: row remapping failed (no spare rows left)",
                    "RMA the GPU (NVIDIA: a remap failure is not recoverable)",
                )
            )
        elif r["pending"]:
            out.append(
                (
                    "REMAP_PENDING",
                    CRITICAL,
                    f"{_label(g)}: a row remap is pending (uncorrected "
                    f"{r['uncorrected'] or 0}, corrected {r['corrected'] or 0}); "
                    "the bad row is in use until a reset",
                    RESET.format(i=g["index"]),
                )
            )
    return out


def retired_pages(f, ctx: Context) -> list:
    out = []
    for g in _gpus(f) or []:
        r = g["retired"]
        total = (r["single_bit"] or 0) + (r["double_bit"] or 0)
        if r["pending"]:
            out.append(
                (
                    "RETIRED_PENDING",
                    CRITICAL,
                    f"{_label(g)}: page retirement pending ({total} retired): "
                    "the bad page is in use until a reset",
                    RESET.format(i=g["index"]),
                )
            )
        elif total >= ctx.thresholds.retired_pages_warn:
            out.append(
                (
                    "RETIRED_MANY",
                    WARN,
                    f"{_label(g)}: {total} retired pages ({r['single_bit'] or 0} "
                    f"single-bit, {r['double_bit'] or 0} double-bit)",
                    "plan an RMA if the count keeps rising",
                )
            )
    return out


def pcie(f, ctx: Context) -> list:
    out = []
    for g in _gpus(f) or []:
        p = g["pcie"]
        idle = g["clock_events"].get("gpu_idle")
        if p["width"] and p["max_width"] and p["width"] < p["max_width"]:
            out.append(
                (
                    "PCIE_WIDTH",
                    CRITICAL,
                    f"{_label(g)}: PCIe link x{p['width']} of x{p['max_width']}",
                    "reseat the GPU or its riser; "
                    "check the slot and the BIOS's bifurcation setting",
                )
            )
        elif p["gen"] and p["max_gen"] and p["gen"] < p["max_gen"] and idle is False:
            out.append(
                (
                    "PCIE_GEN",
                    WARN,
                    f"{_label(g)}: PCIe gen {p['gen']} of {p['max_gen']} while busy",
                    "check the slot, the riser and the BIOS's PCIe speed setting",
                )
            )
    log = f[KERNEL_LOG]
    limited = (
        [ln["text"] for ln in log["lines"] if "limited by" in ln["text"]] if log["readable"] else []
    )
    if limited:
        out.append(
            (
                "PCIE_LIMITED",
                WARN,
                f"kernel: {limited[-1][:200]}"
                + (f" (+{len(limited) - 1} more)" if len(limited) > 1 else ""),
                "reseat the device or move it to a full-width slot",
            )
        )
    return out


_HW_EVENTS = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake",
}


def clock_events(f, ctx: Context) -> list:
    out = []
    for g in _gpus(f) or []:
        ev = g["clock_events"]
        hw = [name for k, name in _HW_EVENTS.items() if ev.get(k)]
        if hw:
            out.append(
                (
                    "CLOCK_HW_SLOWDOWN",
                    CRITICAL,
                    f"{_label(g)}: clocks held down by {', '.join(hw)} "
                    f"({g['clock_events_tag']}): a synchronous job runs at this GPU's pace",
                    "check cooling, power supplies and the power-brake signal; "
                    "reset the GPU or reboot",
                )
            )
        elif ev.get("sw_thermal_slowdown"):
            out.append(
                (
                    "CLOCK_SW_THERMAL",
                    WARN,
                    f"{_label(g)}: SW thermal slowdown ({g['clock_events_tag']})",
                    "check the GPU's temperature and the node's airflow",
                )
            )
    return out


def _xid_groups(evs, window: float) -> dict:
    groups: dict[tuple[int, str], list] = {}
    for e in evs:
        if e.age is None or e.age <= window:
            groups.setdefault((e.code, e.device), []).append(e)
    return groups


def xid(f, ctx: Context) -> list:
    if _gpus(f) is None and f[GPU_DETAIL]["state"] == "absent":
        return []
    log = f[KERNEL_LOG]
    if not log["readable"]:
        return [
            (
                "KLOG_UNREADABLE",
                UNKNOWN,
                f"cannot read the kernel log ({log['error'][:120]}): Xids unseen",
                "sudo sysctl kernel.dmesg_restrict=0, "
                "or add the user to the adm (or systemd-journal) group",
            )
        ]
    window = ctx.thresholds.xid_window_s
    out = []
    off = [
        ln
        for ln in log["lines"]
        if "fallen off the bus" in ln["text"]
        and not xids.XID_LINE.search(ln["text"])
        and (ln["age"] is None or ln["age"] <= window)
    ]
    if off:
        out.append(
            (
                "GPU_OFF_BUS",
                CRITICAL,
                f"kernel: a GPU has fallen off the bus ({off[-1]['text'][:120]})",
                xids.describe(79)["fix"],
            )
        )
    for (code, dev), evs in sorted(_xid_groups(xids.events(log["lines"]), window).items()):
        info = xids.describe(code)
        verdict = {"CRITICAL": CRITICAL, "WARN": WARN, "UNLISTED": WARN}.get(info["verdict"], OK)
        tag = (
            "XID_APP"
            if info["verdict"] == "APP"
            else "XID_HW"
            if verdict is CRITICAL
            else "XID_WARN"
        )
        ago = evs[-1].age
        when = f", last {ago / 60:.0f} min ago" if ago is not None else ""
        what = (
            "an application's fault, not the node's" if info["verdict"] == "APP" else info["name"]
        )
        out.append((tag, verdict, f"Xid {code} on {dev} x{len(evs)}{when}: {what}", info["fix"]))
    return out


def fabric_manager(f, ctx: Context) -> list:
    fab, gpus = f[FABRIC], _gpus(f) or []
    states = {g["fabric_state"] for g in gpus if g["fabric_state"]}
    if fab["nvswitches"] and not fab["running"]:
        return [
            (
                "FABRIC_MANAGER_DOWN",
                CRITICAL,
                f"{fab['nvswitches']} NVSwitch(es) but nvidia-fabricmanager is "
                f"{fab['manager'] or 'not running'}: CUDA cannot use the GPUs together",
                "sudo systemctl enable --now nvidia-fabricmanager "
                "(its version must match the driver's)",
            )
        ]
    bad = states - {"Completed"}
    if bad:
        return [
            (
                "FABRIC_NOT_READY",
                CRITICAL,
                f"GPU fabric state {', '.join(sorted(bad))} (not Completed)",
                "check nvidia-fabricmanager's log; restart it, or reboot the node",
            )
        ]
    return []


def busy(f, ctx: Context) -> list:
    out = []
    for g in _gpus(f) or []:
        procs = [p for p in g["processes"] if (p["type"] or "C") != "G"]
        if procs:
            shown = ", ".join(
                f"pid {p['pid']} {p['name']} ({p['used_mib'] or '?'} MiB)" for p in procs[:3]
            )
            out.append(
                (
                    "GPU_BUSY",
                    CRITICAL,
                    f"{_label(g)} in use: {shown}",
                    "stop those processes (`invoke train.stop` for a nodeprep job), "
                    "or leave the node out: --limit '!NODE'",
                )
            )
    return out


FACTS = (GPU_DETAIL, KERNEL_LOG, FABRIC)
