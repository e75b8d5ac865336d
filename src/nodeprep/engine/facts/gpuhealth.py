"""GPU health facts: what `nvidia-smi -q -x` and `nvidia-smi nvlink -s` (GPU_DETAIL) and the
NVSwitch fabric manager say about a node's GPUs, read as data (the kernel log's lines are
kernellog.py's; the checks that judge them are in ops/health/).

Every tool runs under `timeout`: a wedged driver makes nvidia-smi hang, and a hang is a finding
(`hung`), not a stalled probe. Field names follow the XML (`clocks_event_reasons` since driver
535.54.03, `clocks_throttle_reasons` before: both are read); "N/A" is None.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from nodeprep.engine.facts.probe import Fact

SMI_TIMEOUT = 15  # seconds: nvidia-smi answers in well under 2 on a healthy node
_HUNG = (124, 137)  # timeout(1): 124 after TERM, 137 after the KILL that follows


def _int(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def _yes(text: str | None) -> bool | None:
    t = (text or "").strip().lower()
    return (
        True
        if t in ("yes", "active", "enabled")
        else False
        if t in ("no", "not active", "disabled")
        else None
    )


def _txt(el, path: str) -> str | None:
    found = el.find(path) if el is not None else None
    if found is None or found.text is None:
        return None
    t = found.text.strip()
    return None if t in ("N/A", "", "Unknown Error", "[N/A]") else t


def _sum(el, paths: list[str]) -> int | None:
    vals = [_int(_txt(el, p)) for p in paths]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


# ECC counters: drivers before R510 count single/double bit per memory ("<single_bit><total>"),
# later ones SRAM and DRAM correctable/uncorrectable; later still SRAM uncorrectable is split
# into parity and SEC-DED (590 has only the split fields; where both forms exist, the plain one).
_CORR = ["single_bit/total", "sram_correctable", "dram_correctable"]


def _sram_unc(el) -> int | None:
    plain = _int(_txt(el, "sram_uncorrectable"))
    return (
        plain
        if plain is not None
        else _sum(el, ["sram_uncorrectable_parity", "sram_uncorrectable_secded"])
    )


def _unc(el) -> int | None:
    vals = [
        v
        for v in (_sum(el, ["double_bit/total", "dram_uncorrectable"]), _sram_unc(el))
        if v is not None
    ]
    return sum(vals) if vals else None


def _ecc(gpu) -> dict:
    errs = gpu.find("ecc_errors")
    vol, agg = (errs.find("volatile"), errs.find("aggregate")) if errs is not None else (None, None)
    return {
        "mode": _txt(gpu, "ecc_mode/current_ecc"),
        "pending_mode": _txt(gpu, "ecc_mode/pending_ecc"),
        "volatile_corrected": _sum(vol, _CORR),
        "volatile_uncorrected": _unc(vol),
        "aggregate_corrected": _sum(agg, _CORR),
        "aggregate_uncorrected": _unc(agg),
        "sram_uncorrected": _sram_unc(agg),
        "sram_threshold_exceeded": _yes(_txt(errs, "sram_threshold_exceeded")),
    }


def _retired(gpu) -> dict:
    rp = gpu.find("retired_pages")
    pending = _txt(rp, "pending_retirement") or _txt(rp, "pending_blacklist")
    return {
        "single_bit": _int(_txt(rp, "multiple_single_bit_retirement/retired_count")),
        "double_bit": _int(_txt(rp, "double_bit_retirement/retired_count")),
        "pending": _yes(pending),
    }


def _remap(gpu) -> dict:
    rr = gpu.find("remapped_rows")
    return {
        "corrected": _int(_txt(rr, "remapped_row_corr")),
        "uncorrected": _int(_txt(rr, "remapped_row_unc")),
        "pending": _yes(_txt(rr, "remapped_row_pending")),
        "failure": _yes(_txt(rr, "remapped_row_failure")),
    }


def _pcie(gpu) -> dict:
    link = gpu.find("pci/pci_gpu_link_info")
    return {
        "gen": _int(_txt(link, "pcie_gen/current_link_gen")),
        "max_gen": _int(_txt(link, "pcie_gen/max_link_gen")),
        "width": _int(_txt(link, "link_widths/current_link_width")),
        "max_width": _int(_txt(link, "link_widths/max_link_width")),
    }


def _clock_events(gpu) -> tuple[str | None, dict]:
    """(the element's name, {reason: active}) with the reason names of the newer form."""
    for tag, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        el = gpu.find(tag)
        if el is not None:
            reasons = {c.tag[len(prefix) :]: _yes(c.text) for c in el if c.tag.startswith(prefix)}
            return tag, {k: v for k, v in reasons.items() if v is not None}
    return None, {}


def _processes(gpu) -> list[dict]:
    out = []
    for p in gpu.findall("processes/process_info"):
        out.append(
            {
                "pid": _int(_txt(p, "pid")),
                "name": _txt(p, "process_name") or "?",
                "type": _txt(p, "type"),
                "used_mib": _int(_txt(p, "used_memory")),
            }
        )
    return out


def parse_xml(text: str) -> dict:
    """`nvidia-smi -q -x` -> {driver, cuda, gpus: [...]}: one dict per <gpu>, in order."""
    root = ET.fromstring(text)
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        event_tag, events = _clock_events(g)
        gpus.append(
            {
                "index": i,  # nvidia-smi lists its GPUs in index order
                "bus_id": g.get("id") or _txt(g, "pci/pci_bus_id"),
                "name": _txt(g, "product_name") or "?",
                "persistence": _yes(_txt(g, "persistence_mode")),
                "mig": _txt(g, "mig_mode/current_mig"),
                "ecc": _ecc(g),
                "retired": _retired(g),
                "remap": _remap(g),
                "pcie": _pcie(g),
                "clock_events_tag": event_tag,
                "clock_events": events,
                "processes": _processes(g),
                "fabric_state": _txt(g, "fabric/state"),
                "fabric_status": _txt(g, "fabric/status"),
            }
        )
    return {
        "driver": _txt(root, "driver_version"),
        "cuda": _txt(root, "cuda_version"),
        "gpus": gpus,
    }


# -- GPU_DETAIL: nvidia-smi -q -x ------------------------------------------------------------

# Without nvidia-smi, the device files tell a GPU node whose tools are missing from a CPU node.
# `nvlink -s` runs only when `-q -x` answered: a wedged driver costs one timeout, not two.
GPU_DETAIL_PROBE = (
    "command -v nvidia-smi >/dev/null 2>&1 || {\n"
    "  n=0\n"
    '  for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && n=$((n+1)); done\n'
    '  echo "NO_NVIDIA_SMI $n"\n'
    "  exit 0\n"
    "}\n"
    f"timeout -k 2 {SMI_TIMEOUT} nvidia-smi -q -x 2>&1\n"
    "r=$?\n"
    'echo "@@SMI_RC=$r@@"\n'
    "[ $r -eq 0 ] || exit 0\n"
    f"timeout -k 2 {SMI_TIMEOUT} nvidia-smi nvlink -s 2>&1\n"
    'echo "@@NVLINK_RC=$?@@"'
)


def parse_gpu_detail(text: str, rc: int) -> dict:
    """{present (nvidia-smi is), devices (GPU device files, without nvidia-smi), state:
    ok|hung|error|absent, error, driver, cuda, gpus, nvlink (parse_nvlink's)}."""
    if text.strip().startswith("NO_NVIDIA_SMI"):
        n = text.split()[1:2]
        return {
            "present": False,
            "state": "absent",
            "devices": int(n[0]) if n and n[0].isdigit() else 0,
            "error": None,
            "driver": None,
            "cuda": None,
            "gpus": [],
            "nvlink": {"state": "absent", "gpus": {}},
        }
    m = re.search(r"@@SMI_RC=(\d+)@@", text)
    smi_rc = int(m.group(1)) if m else rc
    body = text[: m.start()] if m else text
    base = {
        "present": True,
        "devices": None,
        "driver": None,
        "cuda": None,
        "gpus": [],
        "error": None,
        "nvlink": {"state": "absent", "gpus": {}},
    }
    if smi_rc in _HUNG:
        return dict(
            base, state="hung", error=f"nvidia-smi -q -x did not answer within {SMI_TIMEOUT} s"
        )
    start = body.find("<?xml")
    start = body.find("<nvidia_smi_log") if start < 0 else start
    if smi_rc != 0 or start < 0:
        return dict(base, state="error", error=body.strip()[-300:] or f"nvidia-smi exited {smi_rc}")
    try:
        parsed = parse_xml(body[start:])
    except ET.ParseError as e:
        return dict(base, state="error", error=f"unreadable XML from nvidia-smi -q -x: {e}")
    rest = text[m.end() :] if m else ""
    nv = re.search(r"@@NVLINK_RC=(\d+)@@", rest)
    nvlink = (
        parse_nvlink(rest[: nv.start()], int(nv.group(1)))
        if nv
        else {"state": "absent", "gpus": {}}
    )
    return dict(base, state="ok", nvlink=nvlink, **parsed)


GPU_DETAIL = Fact("gpu_detail", lambda _v: GPU_DETAIL_PROBE, parse_gpu_detail)


# `nvidia-smi nvlink -s`, line by line. A GPU line starts each GPU's block; under it come link
# lines or one of NVML's messages. NVML's spelling varies between drivers ("NVLink"/"Nvlink",
# "inActive"; Azure's test data lowercases it), so the messages match without case. Sources of
# every shape: tests/facts/gpu_detail/README.md.
_GPU_LINE = re.compile(r"\s*GPU (\d+):(?:\s+(.*))?$")  # not "GPU 0000:0B:00.0: ..."
_LINK_LINE = re.compile(r"\s*Link (\d+):\s*(.*?)\s*$")
_SPEED = re.compile(r"\d+(?:\.\d+)? GB/s")
_MESSAGES = (  # (what NVML says about the GPU, the status it gives the GPU)
    (
        re.compile(r"unable to retrieve nvlink information as all links are inactive", re.I),
        "all_inactive",
    ),
    (re.compile(r"device does not have or support nvlink", re.I), "no_nvlink"),
    (re.compile(r"nvlink queries are not supported for devices in mig mode", re.I), "mig"),
)


def _message(text: str) -> str | None:
    return next((status for pattern, status in _MESSAGES if pattern.search(text)), None)


def _gpu_block(m) -> tuple[str, dict]:
    """A GPU line -> (its index, its entry); NVML's message may follow the name on the same line."""
    rest = m.group(2) or ""
    name = re.split(r"\s*\(UUID:|\s+(?:NVML:|Device does not|Nvlink queries)", rest, flags=re.I)[
        0
    ].strip()
    return m.group(1), {
        "name": name or None,
        "active": 0,
        "inactive": [],
        "unread": 0,
        "status": _message(rest),
    }


def _link(entry: dict, number: int, value: str) -> bool:
    """Count a link line in ENTRY; False when its value is neither a speed nor <inactive>."""
    if _SPEED.fullmatch(value):
        entry["active"] += 1
    elif value.lower() == "<inactive>":
        entry["inactive"].append(number)
    else:
        return False
    return True


def parse_nvlink(text: str, rc: int) -> dict:
    """`nvidia-smi nvlink -s` (exit status RC) -> {state: ok|error|hung, error, unknown (the
    lines not understood, at most 5), gpus: {gpu index (str): {name, active (links with a
    speed), inactive (link numbers), unread (its lines not understood), status}}}. A GPU's
    status: links (link lines), all_inactive (NVML: all links are inactive), no_nvlink (the
    device has none), mig (not readable in MIG mode), silent (its GPU line alone). A link is
    active only with a speed: any other value is not understood, never taken for a link up.
    Empty output (driver 580 on a GPU without NVLink; 595 says no_nvlink): no NVLink."""
    if rc in _HUNG:
        return {
            "state": "hung",
            "error": f"nvidia-smi nvlink -s did not answer within {SMI_TIMEOUT} s",
            "unknown": [],
            "gpus": {},
        }
    gpus: dict[str, dict] = {}
    current, unknown = None, []
    for line in text.splitlines():
        g, lk = _GPU_LINE.match(line), _LINK_LINE.match(line)
        if g:
            index, current = _gpu_block(g)
            gpus[index] = current
        elif current is not None and lk and _link(current, int(lk.group(1)), lk.group(2)):
            continue
        elif current is not None and not lk and current["status"] is None and _message(line):
            current["status"] = _message(line)
        elif line.strip():
            if current is not None:
                current["unread"] += 1
            unknown.append(
                (f"under GPU {index}: " if current is not None else "") + line.strip()[:200]
            )
    for entry in gpus.values():
        entry["status"] = entry["status"] or (
            "links" if entry["active"] or entry["inactive"] else "silent"
        )
    error = None if rc == 0 else ("; ".join(unknown)[-300:] or f"nvidia-smi nvlink -s exited {rc}")
    return {
        "state": "ok" if rc == 0 else "error",
        "error": error,
        "unknown": unknown[:5],
        "gpus": gpus,
    }


# -- FABRIC: NVSwitches and the fabric manager -----------------------------------------------

FABRIC_PROBE = (
    "n=0\n"
    "for d in /proc/driver/nvidia-nvswitch/devices/* /dev/nvidia-nvswitch[0-9]*; do\n"
    '  [ -e "$d" ] && n=$((n+1))\n'
    "done\n"
    'echo "nvswitches $n"\n'
    '[ "$n" -gt 0 ] || exit 0\n'
    "if command -v systemctl >/dev/null 2>&1; then\n"
    '  echo "manager $(timeout 5 systemctl is-active nvidia-fabricmanager 2>/dev/null || true)"\n'
    "else echo 'manager unknown'; fi\n"
    "pgrep -x nv-fabricmanager >/dev/null 2>&1 && echo 'process yes' || echo 'process no'"
)


def parse_fabric(text: str, rc: int) -> dict:
    """{nvswitches, manager: the systemd state or None, running}."""
    vals = dict(ln.split(" ", 1) if " " in ln else (ln, "") for ln in text.strip().splitlines())
    if "manager" not in vals:  # no NVSwitch: nothing else asked
        return {
            "nvswitches": int(vals.get("nvswitches", "0") or 0),
            "manager": None,
            "running": False,
        }
    state = (vals.get("manager") or "").strip() or None
    return {
        "nvswitches": int(vals.get("nvswitches", "0") or 0),
        "manager": None if state == "unknown" else state,
        "running": vals.get("process") == "yes" or state == "active",
    }


FABRIC = Fact("fabric", lambda _v: FABRIC_PROBE, parse_fabric)
