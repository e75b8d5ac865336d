"""The facts behind `invoke torch-plan`, read from torch_matrix.yml beside this module: which
wheels each torch release publishes per CPU platform and CUDA variant, what each is compiled
for, what each CUDA family and GPU generation needs from the driver, and which driver branches
are still supported. Every fact keeps its source and whether it is confirmed; the rule that
uses them is ops/torchplan/plan.py."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

PLATFORMS = ("x86_64", "aarch64")


@lru_cache(maxsize=1)
def table() -> dict:
    # our own data file: libyaml's loader where PyYAML has it (15 ms less on every provision)
    return yaml.load(
        Path(__file__).with_name("torch_matrix.yml").read_text(),
        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
    )


def ver(text) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text)))


def sources(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def cite(keys) -> str:
    """'[a, b]': the source keys of a fact, as --explain shows them."""
    return "[" + ", ".join(keys) + "]" if keys else ""


def minors(released_only: bool = False) -> list[str]:
    rel = table()["releases"]
    return sorted((m for m in rel if rel[m].get("released", True) or not released_only), key=ver)


def release(minor: str) -> dict:
    return table()["releases"][minor]


def pypi_aarch64_cpu(minor: str) -> bool:
    """Whether PyPI's own Linux aarch64 wheel of torch MINOR is the CPU build (plain version)."""
    return minor in table()["pypi_aarch64_cpu"]["releases"]


def released(minor: str) -> bool:
    return release(minor).get("released", True)


def cuda(variant: str) -> str | None:
    """'cu126' -> '12.6'; None for cpu."""
    return f"{variant[2:-1]}.{variant[-1]}" if variant.startswith("cu") else None


def family(variant: str) -> str:
    return variant[2:-1]


def family_min(variant: str) -> str:
    return table()["cuda_families"][family(variant)]["min_driver"]


def toolkit_driver(cuda_version: str | None) -> str | None:
    """The driver bundled with that CUDA toolkit (full feature set, PTX JIT included)."""
    got = table()["toolkit_drivers"].get(cuda_version or "")
    return got if isinstance(got, str) else None


@dataclass
class Wheel:
    """One published build: torch MINOR x CPU platform x variant, as the table states it."""

    minor: str
    cpu_arch: str
    variant: str
    archs: list[str] | None = None  # SASS capabilities; None: the reference gives no list
    unconfirmed_archs: list[str] = field(default_factory=list)
    ptx: dict = field(default_factory=dict)  # exact release -> capability with PTX
    confirmed: bool = True  # False: shown, never selected
    note: str | None = None
    local_tag: bool = True  # False: a +variant pin cannot select it
    source: list[str] = field(default_factory=list)
    arch_set: str | None = None

    def ptx_for(self, full: str) -> str | None:
        return self.ptx.get(full)

    @property
    def selectable(self) -> bool:
        return self.confirmed and self.local_tag

    def row(self, full: str) -> str:
        """The table row as --explain prints it."""
        archs = (
            " ".join(self.archs)
            if self.archs is not None
            else f"arch list unknown{f' ({self.note})' if self.note else ''}"
        )
        if self.ptx_for(full):
            archs += f" (+PTX {self.ptx_for(full)})"
        if self.unconfirmed_archs:
            archs += f" ({' '.join(self.unconfirmed_archs)} unconfirmed)"
        flags = ("" if self.confirmed else ", unconfirmed") + (
            "" if self.local_tag else ", no local tag"
        )
        return (
            f"{self.minor} {self.cpu_arch} {self.variant}: {archs}{flags} {cite(self.source)}"
        ).rstrip()


def _wheel(minor: str, arch: str, variant: str, raw: dict) -> Wheel:
    raw = raw or {}
    w = Wheel(
        minor,
        arch,
        variant,
        confirmed=raw.get("confirmed", True),
        note=raw.get("note"),
        local_tag=raw.get("local_tag", True),
        ptx=dict(raw.get("ptx") or {}),
        source=sources(raw.get("source")) or sources(release(minor).get("source")),
    )
    name = raw.get("archs")
    if name:
        s = table()["arch_sets"][name]
        w.arch_set, w.archs = name, s["archs"].split()
        w.unconfirmed_archs = str(s.get("unconfirmed", "")).split()
        w.source = list(dict.fromkeys(w.source + sources(s.get("source"))))
        if not s.get("confirmed", True):
            w.archs, w.note = None, w.note or s.get("note")
    return w


def wheels(minor: str, cpu_arch: str) -> dict[str, Wheel]:
    """variant -> Wheel for that release and platform (cpu included), newest CUDA first."""
    got = {
        v: _wheel(minor, cpu_arch, v, raw)
        for v, raw in (release(minor).get(cpu_arch) or {}).items()
    }
    return dict(sorted(got.items(), key=lambda kv: ver(cuda(kv[0]) or "0"), reverse=True))


def published(minor: str, cpu_arch: str) -> dict[str, str | None]:
    """variant -> None when selectable, else why not (listed, never selected)."""
    return {
        v: None if w.selectable else (w.note or "unconfirmed")
        for v, w in wheels(minor, cpu_arch).items()
    }


# ---- drivers -------------------------------------------------------------------------------------
def generation(cap: str, cpu_arch: str = "x86_64") -> dict | None:
    """The table's row for a GPU's generation (by the exact capability, else its major)."""
    major = cap.split(".")[0]
    rows = [g for g in table()["gpu_generations"] if g.get("cpu_arch", cpu_arch) == cpu_arch]
    return next((g for g in rows if cap in g["capabilities"]), None) or next(
        (g for g in rows if major in g["capabilities"]), None
    )


def branch_of(driver: str) -> int:
    return ver(driver)[0] if ver(driver) else 0


def supported_branch(min_driver: str, today: datetime.date | None = None) -> str | None:
    """'R580 (LTSB, supported until 2028-08)': the oldest branch still supported TODAY whose
    drivers reach MIN_DRIVER; None when the table knows none."""
    month = (today or datetime.date.today()).strftime("%Y-%m")
    ok = [
        (int(b[1:]), b, row)
        for b, row in table()["driver_branches"].items()
        if row["supported_until"] >= month and int(b[1:]) >= branch_of(min_driver)
    ]
    if not ok:
        return None
    _, b, row = min(ok)
    return f"{b} ({row['kind']}, supported until {row['supported_until']})"


def driver_advice(min_driver: str, today: datetime.date | None = None) -> str:
    """What a fix message recommends: a supported branch, never a bare minimum alone."""
    branch = supported_branch(min_driver, today)
    return (
        f"a supported driver branch: {branch}, at least {min_driver}"
        if branch
        else f"a driver >= {min_driver} "
        "(no branch in the table that reaches it is known to be supported)"
    )


def source_lines(keys) -> list[str]:
    return [
        f"  [{k}] {table()['sources'][k]}" for k in dict.fromkeys(keys) if k in table()["sources"]
    ]
