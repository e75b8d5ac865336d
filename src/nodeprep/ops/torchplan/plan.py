"""Pick the torch wheel for every node of a fleet: one answer per CPU platform, all of the same
torch release. The facts (with their sources) are in ops/torchplan/data.py; this module applies the
rule, in this order:

0. the release is in the table and released (an unreleased one is never planned or suggested);
1. every GPU's generation runs on its own node's driver (Blackwell needs R570+, Kepler ends at
   R470), checked before any wheel is chosen;
2. per platform: the wheels that release publishes for it (selectable ones: confirmed, and a
   `+variant` pin can select them) -> runnable by the platform's OLDEST driver (the CUDA family
   minimum: minor-version compatibility) -> compiled for every GPU there (SASS of the same
   major at an equal or lower minor; PTX only where the wheel carries it for this exact release
   and the driver is at least the toolkit's own driver);
3. a variant that fits every platform wins (the same CUDA and NCCL everywhere), newest first;
   only when none does, each platform gets its own newest;
4. a pick that runs by minor-version compatibility says so.

When nothing fits, the error names the node that blocks, why, and a fix: a supported driver
branch, or the released torch versions that do fit this fleet.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import KW_ONLY, asdict, dataclass, field

from nodeprep.errors import InputError
from nodeprep.ops.torchplan import data as td
from nodeprep.ops.torchplan.generations import check_generations, check_nodes
from nodeprep.ops.torchplan.nodes import (
    ARCH_ALIASES,
    SPEC_SYNTAX,
    NodeGPU,
    cuda_variant_of_modules,
    node_from_facts,
    parse_node_spec,
)
from nodeprep.ops.torchplan.rule import (
    PlanError,
    PlatformGroups,
    covers,
    diagnose,
    evaluate,
    parse_torch,
    picks,
)

DEFAULT_INDEX = "https://download.pytorch.org/whl/{variant}"
# The plan's public names, the node inputs and the rule's pieces included (one import for callers).
__all__ = [
    "DEFAULT_INDEX",
    "ARCH_ALIASES",
    "SPEC_SYNTAX",
    "Build",
    "Plan",
    "PlanError",
    "NodeGPU",
    "choose",
    "covers",
    "evaluate",
    "cuda_variant_of_modules",
    "node_from_facts",
    "parse_node_spec",
]


@dataclass
class Build:
    """The answer for one CPU platform of the fleet."""

    cpu_arch: str
    nodes: list[str]
    variant: str
    _: KW_ONLY
    index_url: str | None
    requirement: str
    cuda: str | None
    arch_list: list[str]
    compat: str | None = None  # one line when it runs by minor-version compatibility
    ptx: str | None = None  # which GPUs run through PTX JIT, if any
    reasons: list[str] = field(default_factory=list)  # why not each other variant


@dataclass
class Plan:
    torch: str
    builds: list[Build]  # one per CPU platform, in the fleet's order
    pypi_default: str | None = None  # what a bare `pip install torch==X` gets (information)
    explain: list[str] = field(default_factory=list)  # table rows and rule steps, with sources
    warning: str | None = None  # the platforms got different variants (CUDA/NCCL differ)

    def for_arch(self, arch: str | None) -> Build:
        arch = ARCH_ALIASES.get(arch or "x86_64", arch)
        return next((b for b in self.builds if b.cpu_arch == arch), self.builds[0])

    def _same(self, attr: str):
        values = {getattr(b, attr) for b in self.builds}
        if len(values) != 1:
            raise ValueError(f"the plan's {attr} differs per platform: use plan.for_arch()")
        return values.pop()

    variant = property(lambda self: self._same("variant"))
    requirement = property(lambda self: self._same("requirement"))
    index_url = property(lambda self: self._same("index_url"))
    cuda = property(lambda self: self._same("cuda"))
    uniform = property(lambda self: len({b.variant for b in self.builds}) == 1)

    def as_dict(self) -> dict:
        common = (
            {k: getattr(self, k) for k in ("variant", "requirement", "index_url", "cuda")}
            if self.uniform
            else {"variant": None}
        )
        return {
            "torch": self.torch,
            **common,
            "builds": [asdict(b) for b in self.builds],
            "pypi_default": self.pypi_default,
            "warning": self.warning,
            "explain": self.explain,
        }


def _fits(fl: PlatformGroups, uniform: bool = False) -> str | None:
    """Released torch versions whose rule succeeds for this fleet: '2.7 (cu128), 2.8-2.10 (cu129)'
    (UNIFORM: only those where one variant fits every platform)."""
    groups: list[list] = []
    for i, m in enumerate(td.minors(released_only=True)):
        got = picks(fl, m, f"{m}.0")
        if not got or (uniform and len({c.variant for c, _ in got.values()}) > 1):
            continue
        chosen = {a: c.variant for a, (c, _) in got.items()}
        label = (
            next(iter(chosen.values()))
            if len(set(chosen.values())) == 1
            else ", ".join(f"{a} {v}" for a, v in chosen.items())
        )
        if any(c.via_ptx for c, _ in got.values()):  # only that exact release carries the PTX
            groups.append([f"{m}.0", f"{m}.0", label, None])
        elif groups and groups[-1][2] == label and groups[-1][3] == i - 1:
            groups[-1][1], groups[-1][3] = m, i
        else:
            groups.append([m, m, label, i])
    return ", ".join(f"{a}{'-' + b if b != a else ''} ({v})" for a, b, v, _ in groups) or None


def _build(fl: PlatformGroups, arch: str, full: str, chosen, template: str) -> Build:
    pick, cands = chosen
    oldest = fl.oldest(arch)
    w = pick.wheel
    reasons = [
        f"{c.variant}: {c.why or f'fits too, {pick.variant} is newer'}"
        for c in cands
        if c is not pick
    ]
    compat = None
    tk = td.toolkit_driver(td.cuda(pick.variant))
    if oldest and tk and td.ver(oldest.driver) < td.ver(tk):
        compat = (
            f"runs by minor-version compatibility: driver {oldest.driver} on {oldest.name} < {tk} "
            f"(CUDA {td.cuda(pick.variant)}'s own driver): "
            "its kernels run, PTX JIT and NVRTC may not"
        )
    archs = list(w.archs or [])
    if archs and pick.ptx_cap:
        archs[archs.index(pick.ptx_cap)] += "+PTX"
    ptx = ", ".join(fl.label(k) for k in pick.via_ptx) or None
    return Build(
        arch,
        [n.name for n in fl.nodes if n.arch == arch],
        pick.variant,
        index_url=template.format(variant=pick.variant),
        requirement=f"torch=={full}+{pick.variant}",
        cuda=td.cuda(pick.variant),
        arch_list=archs,
        compat=compat,
        ptx=f"{ptx} through the {pick.ptx_cap} PTX (JIT)" if ptx else None,
        reasons=reasons,
    )


def from_pip_config(plan: Plan) -> list[str]:
    """PLAN resolved from pip's own configuration (`torch_index: pip-config`: a mirror,
    find-links, PyPI) instead of the PyTorch index: no index URL; an aarch64 CPU build of a
    release whose PyPI aarch64 wheel is the CPU build is pinned by its plain version (PyPI's
    wheel has no +cpu tag). Changes PLAN in place; returns the notes to show."""
    notes = []
    for b in plan.builds:
        b.index_url = None
        minor = ".".join(b.requirement.split("==", 1)[1].split("+")[0].split(".")[:2])
        if b.cpu_arch == "aarch64" and b.variant == "cpu":
            if td.pypi_aarch64_cpu(minor):
                b.requirement = b.requirement.split("+")[0]
                notes.append(
                    f"{b.requirement} for aarch64: "
                    f"PyPI's aarch64 wheel of {minor} is the CPU build "
                    f"{td.cite(td.sources(td.table()['pypi_aarch64_cpu']['source']))}"
                )
            else:
                notes.append(
                    f"{b.requirement} for aarch64 must come from pip's configuration (a mirror of "
                    f"the CPU index): PyPI's aarch64 torch {minor} is a CUDA build; or pin these "
                    "nodes to torch_version 2.10.0 or older"
                )
    return notes


def merged(plans: list[Plan]) -> Plan:
    """One plan of several releases, each for its own CPU platforms (a fleet whose platforms
    pin different torch releases, e.g. aarch64 nodes on a release PyPI serves as CPU)."""
    if len(plans) == 1:
        return plans[0]
    out = Plan(", ".join(p.torch for p in plans), [b for p in plans for b in p.builds])
    out.explain = [line for p in plans for line in p.explain]
    out.warning = "; ".join(filter(None, [p.warning for p in plans])) or (
        "torch differs per platform ("
        + ", ".join(f"{b.cpu_arch} {b.requirement}" for b in out.builds)
        + "): a job spanning platforms may not rendezvous"
    )
    return out


def _cpu_plan(fl: PlatformGroups, full: str, minor: str, template: str, why: list[str]) -> Plan:
    builds = []
    for a in fl.arches:
        w = td.wheels(minor, a).get("cpu")
        if w is None or not w.selectable:
            raise PlanError(
                fl.first(a), f"torch {minor} has no CPU build for {a}", "pick another torch release"
            )
        why.append(f"   {w.row(full)}")
        builds.append(
            Build(
                a,
                [n.name for n in fl.nodes if n.arch == a],
                "cpu",
                index_url=template.format(variant="cpu"),
                requirement=f"torch=={full}+cpu",
                cuda=None,
                arch_list=[],
                reasons=["CUDA variants: no node has a GPU"],
            )
        )
    why.append("2. no node has a GPU: the CPU build on every platform")
    return Plan(full, builds, td.release(minor).get("pypi_default"))


def _cited(why: list[str]) -> list[str]:
    """The explanation, closed by the sources its lines cite."""
    keys = [
        k.strip()
        for line in why
        for group in re.findall(r"\[([\w.,\s-]+)\]", line)
        for k in group.split(",")
    ]
    lines = td.source_lines(keys)
    return why + (["sources:"] + lines if lines else [])


def choose(
    torch: str,
    nodes: list[NodeGPU],
    index_template: str = DEFAULT_INDEX,
    today: datetime.date | None = None,
    prefer: str | None = None,
) -> Plan:
    """The fleet's builds (one per CPU platform), or PlanError naming the node, why and a fix;
    both carry the explanation (`plan.explain`, `error.explain`): table rows and rule steps.
    PREFER: the variant the nodes' loaded cuda module names (cuda_variant_of_modules), taken
    where it fits every platform; the rule's own pick otherwise."""
    why: list[str] = []
    try:
        plan = _choose(torch, nodes, index_template, today, why, prefer)
    except PlanError as e:
        e.explain = _cited((e.explain or why) + [f"=> no build: {e}"])
        raise
    plan.explain = _cited(why)
    return plan


def _release(torch, full: str, minor: str, nodes, index_template: str, why: list[str]) -> dict:
    """Step 0: the index template, the release in the table and released, some nodes; returns
    the release's row."""
    if "{variant}" not in index_template:
        raise InputError(
            f"--index: {index_template!r} has no {{variant}}", hint=f"e.g. {DEFAULT_INDEX}"
        )
    known = td.minors(released_only=True)
    if minor not in td.minors():
        raise PlanError(
            None,
            f"torch {torch} is not in the table (released: {known[0]}-{known[-1]})",
            "pick a released version, "
            "or add it to src/nodeprep/ops/torchplan/torch_matrix.yml with its sources",
        )
    if not nodes:
        raise InputError("--node: give at least one node", hint=f"expected {SPEC_SYNTAX}")
    rel = td.release(minor)
    why.append(
        f"0. torch {full}: {'released' if td.released(minor) else 'NOT released'} "
        f"{td.cite(td.sources(rel['source']))}"
    )
    if not td.released(minor):
        raise PlanError(
            None,
            f"torch {minor}: {rel.get('note', 'not released')}",
            f"pick a released version ({known[0]}-{known[-1]}); "
            "nodeprep never plans an unreleased one",
        )
    return rel


def _mixed(fl: PlatformGroups, plan: Plan) -> str:
    """The warning of a plan whose platforms got different variants, with the torch releases
    where one variant would fit them all."""
    other = _fits(fl, uniform=True)
    return (
        "no one variant fits every platform ("
        + ", ".join(f"{b.cpu_arch} {b.variant}" for b in plan.builds)
        + "): CUDA and the NCCL each wheel brings differ between "
        "platforms, so one job across them may fail; "
        + (
            f"one variant fits all with torch {other}"
            if other
            else "no released torch has one variant for all of them"
        )
    )


def _choose(torch, nodes, index_template, today, why, prefer=None) -> Plan:
    full, minor = parse_torch(torch)
    rel = _release(torch, full, minor, nodes, index_template, why)
    check_nodes(nodes)
    fl = PlatformGroups(nodes)
    if not fl.gpu_nodes:
        return _cpu_plan(fl, full, minor, index_template, why)
    why.append("1. GPU generations against their own node's driver:")
    check_generations(fl, why, today)
    got = picks(fl, minor, full, why, prefer)
    if got is None:
        raise diagnose(fl, minor, full, _fits(fl), today)
    plan = Plan(
        full,
        [_build(fl, a, full, got[a], index_template) for a in fl.arches],
        rel.get("pypi_default"),
    )
    if not plan.uniform:  # a correct answer, but ranks across platforms may not talk: say it
        plan.warning = _mixed(fl, plan)
    for b in plan.builds:
        why.append(
            f"4. {b.cpu_arch}: {b.requirement}"
            + (
                f"; {b.compat}"
                if b.compat
                else "; the driver has this CUDA's full feature set"
                if b.cuda
                else ""
            )
        )
    return plan
