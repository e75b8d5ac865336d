"""GPU facts from nvidia-smi: driver version, model, compute capability, memory per GPU.

No nvidia-smi means a CPU node. Drivers of the R470 branch reject the `compute_cap` field,
so the probe retries without it and the capability comes from a name table (data file).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml

from nodeprep.engine.facts.probe import Fact

QUERY = "driver_version,name,compute_cap,memory.total"
PROBE = (
    "command -v nvidia-smi >/dev/null 2>&1 || { echo NO_NVIDIA_SMI; exit 0; }\n"
    f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader 2>&1 && exit 0\n"
    "echo '@@FALLBACK@@'\n"
    "nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv,noheader 2>&1"
)


@lru_cache(maxsize=1)
def _name_table() -> list[tuple[re.Pattern, str]]:
    data = yaml.load(
        (Path(__file__).with_name("gpu_capabilities.yml")).read_text(),  # our own file
        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
    )
    pats = sorted(data.items(), key=lambda kv: -len(kv[0]))
    return [
        (
            re.compile(
                r"(?<![\w-])"
                + re.escape(k).replace(r"\ ", r"\s*").replace("xx", r"\d\d")
                + r"(?!\w)",
                re.I,
            ),
            v,
        )
        for k, v in pats
    ]


def capability_from_name(name: str) -> str | None:
    for pat, cap in _name_table():
        if pat.search(name):
            return cap
    return None


def _memory_mib(text: str) -> int | None:
    m = re.match(r"\s*(\d+)\s*MiB", text)
    return int(m.group(1)) if m else None


def parse(text: str) -> dict:
    """{'present', 'driver', 'count', 'devices': [{name, capability, memory_mib}], 'error'}."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if lines == ["NO_NVIDIA_SMI"]:
        return {"present": False, "driver": None, "count": 0, "devices": [], "error": None}
    fallback = "@@FALLBACK@@" in lines
    if fallback:
        lines = lines[lines.index("@@FALLBACK@@") + 1 :]
    devices = []
    driver = None
    errors = []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        want = 3 if fallback else 4
        if len(fields) != want or not re.match(r"^\d+\.\d+", fields[0]):
            errors.append(line)
            continue
        if fallback:
            drv, name, mem = fields
            cap = capability_from_name(name)
        else:
            drv, name, cap, mem = fields
        driver = driver or drv
        devices.append({"name": name, "capability": cap, "memory_mib": _memory_mib(mem)})
    error = None
    if not devices:
        error = " ".join(errors) or "nvidia-smi printed nothing"
    return {
        "present": True,
        "driver": driver,
        "count": len(devices),
        "devices": devices,
        "error": error,
    }


def summary(g: dict) -> str:
    """`2x NVIDIA A100-SXM4-80GB (8.0), driver 535.104.05` / `none` / the error."""
    if not g or not g.get("present"):
        return "none"
    if g.get("error"):
        return f"nvidia-smi error: {g['error'][:80]}"
    groups: dict[tuple, int] = {}
    for d in g["devices"]:
        key = (d["name"], d["capability"] or "?")
        groups[key] = groups.get(key, 0) + 1
    parts = [f"{n}x {name} ({cap})" for (name, cap), n in groups.items()]
    return ", ".join(parts) + f", driver {g['driver']}"


GPUS = Fact("gpus", lambda _v: PROBE, lambda text, rc: parse(text))
