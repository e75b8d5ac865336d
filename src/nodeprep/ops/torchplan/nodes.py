"""A fleet's nodes as the torch plan sees them: CPU platform, driver, GPU capabilities (from the
`gpus` fact, or from `invoke torch-plan --node` specs)."""

from __future__ import annotations

import re
from dataclasses import KW_ONLY, dataclass, field

from nodeprep.engine.facts import gpus
from nodeprep.errors import InputError

ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
SPEC_SYNTAX = (
    "NAME:driver=VER,gpu=CAP[+CAP...] or NAME:driver=VER,gpus=NxCAP or NAME:cpu, "
    "plus optional arch=x86_64|aarch64; CAP is 8.0 or a model like A100 "
    "(e.g. a:driver=535.104.05,gpus=8x8.0)"
)


@dataclass
class NodeGPU:
    name: str
    arch: str  # "x86_64" | "aarch64"
    driver: str | None
    _: KW_ONLY
    capabilities: list[str]  # one per GPU, e.g. "8.0"
    cpu_only: bool = False
    models: list[str] = field(default_factory=list)  # GPU names, parallel to capabilities
    error: str | None = None  # nvidia-smi failed (driver not loaded)


def node_from_facts(name: str, arch: str | None, gpus_fact: dict | None, cpu_only: bool) -> NodeGPU:
    """From the `gpus` fact ({'present','driver','count','devices','error'}) and the node's arch."""
    g = gpus_fact or {}
    devs = [] if g.get("error") else (g.get("devices") or [])
    return NodeGPU(
        name,
        ARCH_ALIASES.get(arch or "x86_64", arch),
        g.get("driver"),
        capabilities=[d.get("capability") for d in devs],
        cpu_only=bool(cpu_only),
        models=[d.get("name") or "" for d in devs],
        error=g.get("error"),
    )


def parse_node_spec(text: str, default_arch: str = "x86_64") -> NodeGPU:
    """CLI node: 'a:driver=535.104.05,gpu=8.0', 'gpu=8.0+8.0', 'gpus=8x8.0', 'arch=aarch64',
    'cpu'."""

    def bad(what):
        return InputError(f"--node {text!r}: {what}", hint=f"expected {SPEC_SYNTAX}")

    def cap(tok):  # a capability, or a model name looked up like the nvidia-smi fallback does
        c = tok if re.fullmatch(r"\d+\.\d", tok) else gpus.capability_from_name(tok)
        if not c:
            raise bad(f"{tok!r} is neither a compute capability like 8.0 nor a known GPU model")
        return c, "" if c == tok else tok

    name, sep, rest = (text or "").partition(":")
    if not sep or not re.fullmatch(r"[\w.\-]+", name.strip()):
        raise bad("expected NAME: before the settings")
    vals: dict = {}
    for item in (i.strip() for i in rest.split(",") if i.strip()):
        key, eq, val = item.partition("=")
        if key == "cpu" and not eq:
            val = "yes"
        elif key not in ("driver", "gpu", "gpus", "arch") or not val.strip():
            raise bad(f"unknown or empty setting {item!r}")
        if key in vals:
            raise bad(f"{key} given twice")
        vals[key] = val.strip()
    found = []
    if "gpu" in vals:
        found += [cap(t.strip()) for t in vals["gpu"].split("+")]
    if "gpus" in vals:
        m = re.fullmatch(r"(\d+)\s*x\s*(.+)", vals["gpus"])
        if not m or int(m[1]) < 1:
            raise bad(f"gpus={vals['gpus']}: expected COUNTxCAP like 8x8.0")
        found += [cap(m[2].strip())] * int(m[1])
    if "cpu" in vals and (found or "driver" in vals):
        raise bad("cpu excludes driver=, gpu= and gpus=")
    if "cpu" not in vals and not found:
        raise bad("give gpu=/gpus= with driver=, or cpu")
    if found and not re.fullmatch(r"\d+(\.\d+){0,3}", vals.get("driver", "")):
        raise bad("driver=VERSION (like 535.104.05) is required with gpu=/gpus=")
    arch = vals.get("arch", default_arch)
    if arch not in ARCH_ALIASES:
        raise bad(f"arch={arch}: expected x86_64 or aarch64")
    return NodeGPU(
        name.strip(),
        ARCH_ALIASES[arch],
        vals.get("driver"),
        capabilities=[c for c, _ in found],
        cpu_only="cpu" in vals,
        models=[m for _, m in found],
    )


# A loaded CUDA toolkit module as sites name it: cuda/12.6, cuda/12.6.3, cudatoolkit/12.4
CUDA_MODULE = re.compile(r"(?:cuda|cudatoolkit|cuda-toolkit)/(\d+)\.(\d+)(?:[._-].*)?")


def cuda_variant_of_modules(loaded: list[str] | None) -> str | None:
    """The torch variant (cu126) of the first loaded CUDA toolkit module (`module -t list`'s
    names), None when none is loaded or its version is no CUDA release (11-13: Cray's
    cudatoolkit/23.9_11.8 names the HPC SDK first and is not read)."""
    for name in loaded or []:
        hit = CUDA_MODULE.fullmatch(name.strip().lower())
        if hit and 11 <= int(hit.group(1)) <= 13:
            return f"cu{hit.group(1)}{hit.group(2)}"
    return None
