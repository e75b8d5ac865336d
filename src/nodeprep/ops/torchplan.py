"""Pick the one torch wheel (CUDA variant) that runs on every node of a fleet.

One build everywhere, so torch and its bundled NCCL are identical on all nodes. The facts live in
torch_matrix.yml beside this module (each with its public source); this module only applies
the rule: published for every node's CPU arch -> runnable
by the OLDEST driver (CUDA minor-version compatibility: the family minimum) -> compiled for every
GPU's compute capability -> the newest left. When nothing is left, the error names the node that
blocks and what would fix it (a driver, or torch releases that do fit, computed from the table).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from nodeprep.engine.facts import gpus
from nodeprep.errors import InputError, NodeprepError

DEFAULT_INDEX = "https://download.pytorch.org/whl/{variant}"
ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
SPEC_SYNTAX = ("NAME:driver=VER,gpu=CAP[+CAP...] or NAME:driver=VER,gpus=NxCAP or NAME:cpu, "
               "plus optional arch=x86_64|aarch64; CAP is 8.0 or a model like A100 "
               "(e.g. a:driver=535.104.05,gpus=8x8.0)")


@dataclass
class NodeGPU:
    name: str
    arch: str                      # "x86_64" | "aarch64"
    driver: str | None
    capabilities: list[str]        # one per GPU, e.g. "8.0"
    cpu_only: bool = False
    models: list[str] = field(default_factory=list)  # GPU names, parallel to capabilities
    error: str | None = None       # nvidia-smi failed (driver not loaded)


@dataclass
class Plan:
    torch: str
    variant: str
    index_url: str
    requirement: str
    cuda: str | None
    arch_list: list[str]
    reasons: list[str]
    pypi_default: str | None = None  # what a bare `pip install torch==X` gets (information)

    def as_dict(self) -> dict:
        return asdict(self)


class PlanError(NodeprepError):
    """No single build fits: names the blocking node (None: not node-specific), why, and a fix."""

    def __init__(self, node: str | None, reason: str, fix: str):
        super().__init__(f"node {node}: {reason}" if node else reason, hint=fix)
        self.node, self.reason, self.fix = node, reason, fix

    def __str__(self) -> str:  # the fix often holds parentheses itself
        return f"{self.message}. Fix: {self.fix}"


# ---- the table -------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def table() -> dict:
    return yaml.safe_load((Path(__file__).with_name("torch_matrix.yml")).read_text())


def _ver(text) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text)))


def _minors() -> list[str]:
    return sorted(table()["releases"], key=_ver)


def _cuda(variant: str) -> str:          # "cu126" -> "12.6"
    return f"{variant[2:-1]}.{variant[-1]}"


def _min_driver(variant: str) -> str:
    return table()["cuda_families"][variant[2:-1]]["min_driver"]


def published(minor: str, cpu_arch: str) -> dict[str, str | None]:
    """variant -> None when confirmed, else the 'unconfirmed' note (listed, never selected)."""
    rows = [{"variant": v} if isinstance(v, str) else v for v in table()["releases"][minor].get(cpu_arch, [])]
    return {r["variant"]: None if r.get("confirmed", True) else r.get("note", "unconfirmed") for r in rows}


def _in_range(minor: str, rng: str) -> bool:
    if rng.endswith("+"):
        return _ver(minor) >= _ver(rng[:-1])
    lo, _, hi = rng.partition("-")
    return _ver(lo) <= _ver(minor) <= _ver(hi or lo)


def arch_list(minor: str, variant: str, cpu_arch: str) -> tuple[list[str], bool] | None:
    """(capabilities, has PTX) of that build, or None when the reference gives no list."""
    rows = [r for r in table()["arch_lists"] if variant in r["variants"]
            and _in_range(minor, r["torch"]) and r.get("cpu_arch", cpu_arch) == cpu_arch]
    rows.sort(key=lambda r: "cpu_arch" not in r)  # a row naming the arch beats a generic one
    return (rows[0]["archs"].split(), bool(rows[0].get("ptx"))) if rows else None


def covers(archs: list[str], ptx: bool, cap: str) -> bool:
    """sm_XY code runs on the same major at an equal or higher minor, never across majors;
    PTX of the newest listed arch JIT-compiles for anything newer."""
    c, listed = _ver(cap), [_ver(a) for a in archs]
    return any(a[0] == c[0] and a[1] <= c[1] for a in listed) or (ptx and c > max(listed))


# ---- the rule --------------------------------------------------------------------------------
@dataclass
class _Cand:
    variant: str
    why: str | None = None         # first reason it is dropped, in rule order; None = fits
    published: bool = True
    unknown: bool = False          # no arch list in the reference
    missing: list = field(default_factory=list)  # GPU keys (arch, cap) its arch list lacks


def _gpu_keys(gpu_nodes) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(cpu arch, capability) -> [(node, model)]: arch lists differ between x86_64 and aarch64."""
    keys: dict = {}
    for n in gpu_nodes:
        for i, cap in enumerate(n.capabilities):
            who = (n.name, n.models[i] if i < len(n.models) else "")
            if who not in keys.setdefault((n.arch, cap), []):
                keys[(n.arch, cap)].append(who)
    return keys


def _label(keys, key) -> str:
    (name, model), more = keys[key][0], len(keys[key]) - 1
    return f"sm_{key[1].replace('.', '')} ({model + ' ' if model else ''}on {name}{f' +{more}' if more else ''})"


def _evaluate(minor, arches, keys, oldest) -> list[_Cand]:
    rel = table()["releases"][minor]
    variants = {v if isinstance(v, str) else v["variant"] for a in ("x86_64", "aarch64")
                for v in rel.get(a, [])} - {"cpu"}
    cands = []
    for v in sorted(variants, key=lambda v: _ver(_cuda(v)), reverse=True):
        c = _Cand(v)
        for a in arches:
            pub = published(minor, a)
            if v not in pub or pub[v]:
                c.published = False
                c.why = c.why or (f"not published for {a}" if v not in pub else f"{pub[v]} (not selected)")
        for key in keys:
            al = arch_list(minor, v, key[0])
            if al is None:
                c.unknown = True
            elif not covers(*al, key[1]):
                c.missing.append(key)
        if _ver(oldest.driver) < _ver(_min_driver(v)):
            c.why = c.why or (f"needs driver >= {_min_driver(v)} (CUDA {v[2:-1]}.x); oldest driver "
                              f"is {oldest.driver} on {oldest.name}")
        if c.unknown:
            c.why = c.why or "arch list not in the reference (unconfirmed)"
        if c.missing:
            c.why = c.why or "lacks " + ", ".join(_label(keys, k) for k in c.missing)
        cands.append(c)
    return cands


def _fits(arches, keys, oldest) -> str | None:
    """Torch releases whose rule succeeds for this fleet, as '2.0-2.5 (cu118), 2.7 (cu128)'."""
    groups: list[list] = []
    for i, m in enumerate(_minors()):
        pick = next((c.variant for c in _evaluate(m, arches, keys, oldest) if c.why is None), None)
        if pick and groups and groups[-1][2] == pick and groups[-1][3] == i - 1:
            groups[-1][1], groups[-1][3] = m, i
        elif pick:
            groups.append([m, m, pick, i])
    return ", ".join(f"{a}{'-' + b if b != a else ''} ({v})" for a, b, v, _ in groups) or None


def _diagnose(minor, nodes, arches, keys, oldest, cands) -> PlanError:
    fits = _fits(arches, keys, oldest)
    alt = f"use torch {fits}" if fits else "no torch release in the table fits this fleet"
    pub = [c for c in cands if c.published]
    if not pub:
        a = min(arches, key=lambda a: sum(p is None for v, p in published(minor, a).items() if v != "cpu"))
        notes = [table()["releases"][minor].get("note", {}).get(a)] + [
            f"{v}: {p}" for v, p in published(minor, a).items() if p]
        extra = "; ".join(n for n in notes if n)
        return PlanError(next(n.name for n in nodes if n.arch == a),
                         f"torch {minor} has no CUDA build for {a}{f' ({extra})' if extra else ''}", alt)
    gpu_ok = [c for c in pub if not c.unknown and not c.missing]
    if not gpu_ok:
        covering = {k: [c for c in pub if not c.unknown and k not in c.missing] for k in keys}
        k = min(keys, key=lambda k: len(covering[k]))
        node = keys[k][0][0]
        if not covering[k]:
            where = f" for {k[0]}" if k[0] != "x86_64" else ""
            unk = [c.variant for c in pub if c.unknown]
            more = f" (arch list unknown for {', '.join(unk)})" if unk else ""
            return PlanError(node, f"{_label(keys, k)} is in no torch {minor} build{where}{more}", alt)
        lacks = {m for c in covering[k] for m in c.missing}
        names = ", ".join(c.variant for c in covering[k])
        return PlanError(node, f"no torch {minor} build covers every GPU: {_label(keys, k)} is only in "
                         f"{names}, which lack{'s' if len(covering[k]) == 1 else ''} "
                         + ", ".join(_label(keys, m) for m in lacks), alt)
    fams = [f for f, row in table()["cuda_families"].items() if _ver(oldest.driver) >= _ver(row["min_driver"])]
    if not fams:
        lowest = min(table()["cuda_families"].items(), key=lambda kv: _ver(kv[1]["min_driver"]))
        reason = f"driver {oldest.driver} is older than any CUDA family ({lowest[0]}.x needs >= {lowest[1]['min_driver']})"
    else:
        mine = [c for c in pub if c.variant[2:-1] in fams]
        reason = (f"driver {oldest.driver} supports CUDA {'/'.join(f + '.x' for f in fams)} only; torch {minor} "
                  + ("; ".join(f"{c.variant}: {c.why}" for c in mine) if mine
                     else f"has no {'/'.join('cu' + f + 'x' for f in fams)} build"))
    ups = {}
    for c in gpu_ok:  # newest fitting variant per CUDA family the driver cannot run
        ups.setdefault(c.variant[2:-1], c.variant)
    bundled = table()["toolkit_drivers"]
    up = ", ".join(f">= {_min_driver(v)} for {v}" + (f" ({bundled[_cuda(v)]} for all of CUDA {_cuda(v)})"
                   if _cuda(v) in bundled else "") for v in sorted(ups.values(), key=lambda v: _ver(_min_driver(v))))
    return PlanError(oldest.name, reason, f"upgrade its driver to {up}, or {alt}")


def _parse_torch(torch: str | None) -> tuple[str, str]:
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", (torch or "").strip())
    if not m:
        raise InputError(f"--torch: expected a release like 2.5.1, got {torch!r}",
                         hint="give the public version only; the plan picks the +cuXYZ variant")
    return f"{m[1]}.{m[2]}.{m[3] or 0}", f"{m[1]}.{m[2]}"


def choose(torch: str, nodes: list[NodeGPU], index_template: str = DEFAULT_INDEX) -> Plan:
    """The single build for the fleet, or PlanError naming the blocking node, why, and a fix."""
    full, minor = _parse_torch(torch)
    if "{variant}" not in index_template:
        raise InputError(f"--index: {index_template!r} has no {{variant}}", hint=f"e.g. {DEFAULT_INDEX}")
    if minor not in table()["releases"]:
        raise PlanError(None, f"torch {torch} is not in the table (known: {_minors()[0]}-{_minors()[-1]})",
                        "pick a known release, or add it to src/nodeprep/ops/torch_matrix.yml with its sources")
    if not nodes:
        raise InputError("--node: give at least one node", hint=f"expected {SPEC_SYNTAX}")
    for n in (n for n in nodes if n.error and not n.cpu_only):
        raise PlanError(n.name, f"nvidia-smi failed, driver not loaded? ({n.error[:100]})",
                        "load the NVIDIA driver so nvidia-smi lists the GPUs, or mark it cpu_only: true")
    arches = list(dict.fromkeys(n.arch for n in nodes))
    gpu_nodes = [n for n in nodes if n.capabilities and not n.cpu_only]
    default = table()["releases"][minor].get("default")
    if not gpu_nodes:  # a CPU fleet: no parity question, the CPU build everywhere
        for a in arches:
            if published(minor, a).get("cpu", "missing"):
                raise PlanError(next(n.name for n in nodes if n.arch == a),
                                f"torch {minor} has no CPU build for {a}", "pick another torch release")
        return Plan(full, "cpu", index_template.format(variant="cpu"), f"torch=={full}+cpu", None, [],
                    ["CUDA variants: no node has a GPU"], default)
    for n in nodes:
        if not n.cpu_only and not n.capabilities:
            raise PlanError(n.name, "has no GPU while other nodes have", "mark it cpu_only: true or fix its driver")
        for i, cap in enumerate(n.capabilities if not n.cpu_only else []):
            if not re.fullmatch(r"\d+\.\d+", cap or ""):
                model = n.models[i] if i < len(n.models) else "a GPU"
                raise PlanError(n.name, f"compute capability of {model} unknown",
                                "add the model to src/nodeprep/engine/gpu_capabilities.yml")
        if n.capabilities and not n.cpu_only and not re.match(r"\d+", n.driver or ""):
            raise PlanError(n.name, f"driver version unknown ({n.driver!r})", "check nvidia-smi on the node")
    oldest = min(gpu_nodes, key=lambda n: _ver(n.driver))
    keys = _gpu_keys(gpu_nodes)
    cands = _evaluate(minor, arches, keys, oldest)
    pick = next((c for c in cands if c.why is None), None)
    if pick is None:
        raise _diagnose(minor, nodes, arches, keys, oldest, cands)
    reasons = [f"{c.variant}: {c.why or 'fits too, ' + pick.variant + ' is newer'}" for c in cands if c is not pick]
    archs, ptx = arch_list(minor, pick.variant, gpu_nodes[0].arch)
    return Plan(full, pick.variant, index_template.format(variant=pick.variant),
                f"torch=={full}+{pick.variant}", _cuda(pick.variant),
                archs[:-1] + [archs[-1] + ("+PTX" if ptx else "")], reasons, default)


# ---- inputs ----------------------------------------------------------------------------------
def node_from_facts(name: str, arch: str | None, gpus_fact: dict | None, cpu_only: bool) -> NodeGPU:
    """From the `gpus` fact ({'present','driver','count','devices','error'}) and the node's arch."""
    g = gpus_fact or {}
    devs = [] if g.get("error") else (g.get("devices") or [])
    return NodeGPU(name, ARCH_ALIASES.get(arch or "x86_64", arch), g.get("driver"),
                   [d.get("capability") for d in devs], bool(cpu_only),
                   [d.get("name") or "" for d in devs], g.get("error"))


def parse_node_spec(text: str, default_arch: str = "x86_64") -> NodeGPU:
    """CLI node: 'a:driver=535.104.05,gpu=8.0', 'gpu=8.0+8.0', 'gpus=8x8.0', 'arch=aarch64', 'cpu'."""
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
    return NodeGPU(name.strip(), ARCH_ALIASES[arch], vals.get("driver"), [c for c, _ in found],
                   "cpu" in vals, [m for _, m in found])
