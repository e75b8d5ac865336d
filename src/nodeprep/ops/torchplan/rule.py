"""The torch plan's rule, per CPU platform (steps 2 and 3 of ops/torchplan/plan.py): which wheels
of a release fit that platform's drivers and GPUs, which variant the fleet takes, and, when none
fits, which node blocks and why. Pure: facts from ops/torchplan/data, nodes from
ops/torchplan/nodes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.torchplan import data as td
from nodeprep.ops.torchplan.nodes import NodeGPU


class PlanError(NodeprepError):
    """No build fits: names the blocking node (None: not node-specific), why, and a fix."""

    def __init__(self, node: str | None, reason: str, fix: str, explain: list[str] | None = None):
        super().__init__(f"node {node}: {reason}" if node else reason, hint=fix)
        self.node = node
        self.reason = reason
        self.fix = fix
        self.explain = explain if explain is not None else []

    def __str__(self) -> str:  # the fix often holds parentheses itself
        return f"{self.message}. Fix: {self.fix}"

    def with_explain(self, why: list[str]) -> "PlanError":
        self.explain = why
        return self


def parse_torch(torch: str | None) -> tuple[str, str]:
    """'2.5' -> ('2.5.0', '2.5'); a local tag or anything else is bad input."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", (torch or "").strip())
    if not m:
        raise InputError(
            f"--torch: expected a release like 2.5.1, got {torch!r}",
            hint="give the public version only; the plan picks the +cuXYZ variant",
        )
    return f"{m[1]}.{m[2]}.{m[3] or 0}", f"{m[1]}.{m[2]}"


def covers(archs: list[str], ptx: bool, cap: str) -> bool:
    """sm_XY code runs on the same major at an equal or higher minor, never across majors;
    PTX of the newest listed arch JIT-compiles for anything newer (when the wheel has it)."""
    c, listed = td.ver(cap), [td.ver(a) for a in archs]
    return any(a[0] == c[0] and a[1] <= c[1] for a in listed) or (
        ptx and bool(listed) and c > max(listed)
    )


class PlatformGroups:
    """The nodes grouped as the rule needs them: per CPU platform, its GPUs and oldest driver."""

    def __init__(self, nodes: list[NodeGPU]):
        self.nodes = nodes
        self.arches = list(dict.fromkeys(n.arch for n in nodes))
        self.gpu_nodes = [n for n in nodes if n.capabilities and not n.cpu_only]
        self._keys: dict = {}
        for n in self.gpu_nodes:  # (cpu arch, capability) -> [(node, model)]
            for i, cap in enumerate(n.capabilities):
                who = (n.name, n.models[i] if i < len(n.models) else "")
                if who not in self._keys.setdefault((n.arch, cap), []):
                    self._keys[(n.arch, cap)].append(who)

    def keys(self, arch: str) -> dict:
        return {k: v for k, v in self._keys.items() if k[0] == arch}

    def oldest(self, arch: str) -> NodeGPU | None:
        here = [n for n in self.gpu_nodes if n.arch == arch]
        return min(here, key=lambda n: td.ver(n.driver)) if here else None

    def first(self, arch: str) -> str:
        return next(n.name for n in self.nodes if n.arch == arch)

    def label(self, key) -> str:
        (name, model), more = self._keys[key][0], len(self._keys[key]) - 1
        return (
            f"sm_{key[1].replace('.', '')} "
            f"({model + ' ' if model else ''}on {name}{f' +{more}' if more else ''})"
        )


@dataclass
class Cand:
    variant: str
    wheel: td.Wheel
    rank: int  # 0 = the newest CUDA of this release and platform
    why: str | None = None  # first reason it is dropped, in rule order; None = fits
    unknown: bool = False  # no arch list in the reference
    missing: list = field(default_factory=list)  # GPU keys its arch list lacks
    via_ptx: list = field(default_factory=list)  # GPU keys it runs through PTX JIT
    ptx_cap: str | None = None
    notes: list = field(default_factory=list)
    jit_driver: str | None = None  # the driver its PTX would need (it has PTX, the driver is older)

    @property
    def selectable(self) -> bool:
        return self.wheel.selectable


def _coverage(c: Cand, fl: PlatformGroups, full: str, oldest: NodeGPU | None, keys: dict) -> None:
    """Which GPUs the wheel runs: SASS, or PTX only where this release's wheel carries it and
    the driver is at least the toolkit's own (minor-version compatibility has no PTX JIT)."""
    w = c.wheel
    ptx, tk = w.ptx_for(full), td.toolkit_driver(td.cuda(c.variant))
    jit = (
        bool(ptx) and tk is not None and oldest is not None and td.ver(oldest.driver) >= td.ver(tk)
    )
    for k in keys:
        if covers(w.archs, False, k[1]):
            continue
        if jit and covers([ptx], True, k[1]):
            c.via_ptx.append(k)
            c.ptx_cap = ptx
        else:
            c.missing.append(k)
    if not c.missing:
        return
    if any(covers([a], False, k[1]) for k in c.missing for a in w.unconfirmed_archs):
        c.notes.append(f"{' '.join(w.unconfirmed_archs)} unconfirmed in this build")
    newer = [k for k in c.missing if td.ver(k[1]) > max(td.ver(a) for a in w.archs)]
    if newer and ptx:
        c.notes.append(
            f"its {ptx} PTX JITs only on a driver >= {tk} (CUDA {td.cuda(c.variant)}'s own); "
            f"oldest is {oldest.driver}"
        )
        c.jit_driver = tk
    elif newer:
        c.notes.append(
            "no PTX in this release wheel"
            if c.wheel.ptx or td.family(c.variant) == "13"
            else "no PTX listed for this build"
        )
    c.why = c.why or "lacks " + ", ".join(fl.label(k) for k in c.missing) + (
        f" ({'; '.join(c.notes)})" if c.notes else ""
    )


def evaluate(fl: PlatformGroups, minor: str, full: str, arch: str) -> list[Cand]:
    """Every CUDA wheel of MINOR for ARCH, newest first, each with why it is dropped (or None)."""
    keys, oldest = fl.keys(arch), fl.oldest(arch)
    out = []
    for rank, (v, w) in enumerate((v, w) for v, w in td.wheels(minor, arch).items() if v != "cpu"):
        c = Cand(v, w, rank)
        if not w.selectable:
            c.why = f"{w.note or 'unconfirmed'} (not selected)"
        if oldest and td.ver(oldest.driver) < td.ver(td.family_min(v)):
            c.why = c.why or (
                f"needs driver >= {td.family_min(v)} (CUDA {td.family(v)}.x); oldest driver "
                f"is {oldest.driver} on {oldest.name}"
            )
        if keys and w.archs is None:
            c.unknown = True
            c.why = c.why or (
                f"arch list unconfirmed ({w.note})"
                if w.arch_set
                else "arch list not in the reference" + (f" ({w.note})" if w.note else "")
            )
        elif keys:
            _coverage(c, fl, full, oldest, keys)
        out.append(c)
    return out


def _record(why: list[str], fl: PlatformGroups, minor: str, full: str, per: dict) -> None:
    for a, cands in per.items():
        old = fl.oldest(a)
        drv = (
            f"oldest driver {old.driver} on {old.name}" if old else "CPU-only nodes: any wheel runs"
        )
        why.append(f"2. {a} ({drv}): the wheels of torch {minor} for {a}")
        for c in cands:
            why.append(f"   {c.wheel.row(full)}")
            why.append(f"     -> {'fits' if c.why is None else 'dropped: ' + c.why}")


def picks(
    fl: PlatformGroups,
    minor: str,
    full: str,
    why: list[str] | None = None,
    prefer: str | None = None,
) -> dict | None:
    """{arch: (picked Cand, all Cands)}: a variant fitting every platform wins, newest first
    (PREFER first where it fits every platform: the CUDA toolkit the nodes' loaded `cuda`
    module gives, e.g. cu126); else each platform's newest. None when some platform has no
    fitting wheel."""
    per = {a: evaluate(fl, minor, full, a) for a in fl.arches}
    if why is not None:
        _record(why, fl, minor, full, per)
    fits = {a: [c.variant for c in per[a] if c.why is None] for a in fl.arches}
    for a in fl.arches:  # a platform of CPU-only nodes with no CUDA wheel takes the CPU one
        cpu = td.wheels(minor, a).get("cpu")
        if not fits[a] and fl.oldest(a) is None and cpu and cpu.selectable:
            per[a].append(Cand("cpu", cpu, len(per[a])))
            fits[a] = ["cpu"]
    if not all(fits.values()):
        return None
    common = [v for v in fits[fl.arches[0]] if all(v in f for f in fits.values())]
    if prefer and prefer in common:
        common.remove(prefer)
        common.insert(0, prefer)
    if prefer and why is not None:
        why.append(
            f"2b. the nodes' cuda module asks for {prefer}: "
            + (
                "it fits every platform"
                if common and common[0] == prefer
                else "no fitting wheel of that variant here, the rule's pick stands"
            )
        )
    out = {}
    for a in fl.arches:
        v = common[0] if common else fits[a][0]
        for c in per[a]:
            if c.why is None and c.variant != v and c.variant not in common:
                c.why = f"fits {a} but not every platform; {v} does"
            elif c.why is None and c.variant != v and v == prefer:
                c.why = f"fits too; the nodes' cuda module asks for {v}"
        out[a] = (next(c for c in per[a] if c.variant == v), per[a])
    if why is not None:
        why.append(
            f"3. one variant for every platform: {common[0]}"
            if common
            else "3. no variant fits every platform: "
            + ", ".join(f"{a} {c.variant}" for a, (c, _) in out.items())
            + f" (the same torch {full}; each CUDA variant brings its own NCCL wheel)"
        )
    return out


def diagnose(fl: PlatformGroups, minor: str, full: str, fits: str | None, today) -> PlanError:
    """Why the first platform without a fitting wheel has none, and what would fix it."""
    alt = f"use torch {fits}" if fits else "no released torch in the table fits this fleet"
    per = {a: evaluate(fl, minor, full, a) for a in fl.arches}
    failing = [
        a
        for a in fl.arches
        if not any(c.why is None for c in per[a])
        and not (fl.oldest(a) is None and td.wheels(minor, a).get("cpu"))
    ]
    if not failing:  # not reached: picks() falls back to each platform's own newest
        return PlanError(None, f"torch {minor}: no build fits", alt)
    first = _diagnose_arch(fl, failing[0], (minor, per[failing[0]]), alt, today)
    more = [
        f"{a}: {_diagnose_arch(fl, a, (minor, per[a]), alt, today).message}" for a in failing[1:]
    ]
    alone = [
        f"{a} alone would take {next(c.variant for c in per[a] if c.why is None)}"
        for a in fl.arches
        if a not in failing and any(c.why is None for c in per[a])
    ]
    if not more and not alone:
        return first
    return PlanError(first.node, "; ".join([first.reason] + more + alone), first.fix)


def _gpu_reason(fl: PlatformGroups, arch: str, minor: str, pub: list[Cand]) -> tuple[str, str]:
    keys = fl.keys(arch)
    covering = {k: [c for c in pub if not c.unknown and k not in c.missing] for k in keys}
    k = min(keys, key=lambda k: len(covering[k]))
    where = f" for {arch}" if arch != "x86_64" else ""
    if not covering[k]:
        unk = [c.variant for c in pub if c.unknown]
        by_note: dict = {}
        for c in pub:
            for n in c.notes if k in c.missing else []:
                by_note.setdefault(n, []).append(c.variant)
        notes = [f"{', '.join(vs)}: {n}" for n, vs in by_note.items()]
        notes += [f"arch list unknown for {', '.join(unk)}"] if unk else []
        return keys[k][0][0], (
            f"{fl.label(k)} is in no torch {minor} build{where}"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    lacks = list(dict.fromkeys(m for c in covering[k] for m in c.missing))
    names = ", ".join(c.variant for c in covering[k])
    return keys[k][0][0], (
        f"no torch {minor} build{where} covers every GPU: {fl.label(k)} is only in {names}, "
        f"which lack{'s' if len(covering[k]) == 1 else ''} " + ", ".join(fl.label(m) for m in lacks)
    )


def _driver_reason(oldest, pub: list, minor: str) -> str:
    """Why the platform's OLDEST driver runs none of torch MINOR's published builds (PUB): the
    CUDA families it supports, and what each of their builds lacks."""
    fams = [
        f
        for f, row in td.table()["cuda_families"].items()
        if td.ver(oldest.driver) >= td.ver(row["min_driver"])
    ]
    if not fams:
        low = min(td.table()["cuda_families"].items(), key=lambda kv: td.ver(kv[1]["min_driver"]))
        reason = (
            f"driver {oldest.driver} is older than any CUDA family "
            f"({low[0]}.x needs >= {low[1]['min_driver']})"
        )
    else:
        mine = [c for c in pub if td.family(c.variant) in fams]
        reason = (
            f"driver {oldest.driver} supports CUDA {'/'.join(f + '.x' for f in fams)} only; "
            f"torch {minor} "
            + (
                "; ".join(f"{c.variant}: {c.why}" for c in mine)
                if mine
                else f"has no {'/'.join('cu' + f + 'x' for f in fams)} build"
            )
        )
    return reason


def _diagnose_arch(fl: PlatformGroups, arch: str, rel: tuple, alt: str, today) -> PlanError:
    (minor, cands), oldest = rel, fl.oldest(arch)
    pub = [c for c in cands if c.selectable]
    if not pub:
        notes = "; ".join(f"{c.variant}: {c.wheel.note or 'unconfirmed'}" for c in cands)
        return PlanError(
            oldest.name if oldest else fl.first(arch),
            f"torch {minor} has no CUDA build for {arch}"
            + (f" that a pin can select ({notes})" if notes else ""),
            alt,
        )
    if not [c for c in pub if not c.unknown and not c.missing]:
        node, reason = _gpu_reason(fl, arch, minor, pub)
        jit = sorted({c.jit_driver for c in pub if c.jit_driver}, key=td.ver)
        if jit:  # a wheel with PTX would run it on a newer driver: that is a fix too
            branch = td.supported_branch(jit[0], today)
            alt = (
                f"upgrade its driver to >= {jit[0]} (the PTX of torch {minor}.0 JITs from there)"
                + (f"; a supported branch: {branch}" if branch else "")
                + f", or {alt}"
            )
        return PlanError(node, reason, alt)
    reason = _driver_reason(oldest, pub, minor)
    ups: dict = {}
    for c in pub:  # the newest fitting variant per CUDA family the driver cannot run
        if not c.unknown and not c.missing:
            ups.setdefault(td.family(c.variant), c.variant)
    order = sorted(ups.values(), key=lambda v: td.ver(td.family_min(v)))
    up = ", ".join(
        f">= {td.family_min(v)} for {v}"
        + (
            f" ({td.toolkit_driver(td.cuda(v))} for all of CUDA {td.cuda(v)})"
            if td.toolkit_driver(td.cuda(v))
            else ""
        )
        for v in order
    )
    branch = td.supported_branch(td.family_min(order[0]), today) if order else None
    return PlanError(
        oldest.name,
        reason,
        f"upgrade its driver to {up}"
        + (f"; a supported branch: {branch}" if branch else "")
        + f", or {alt}",
    )
