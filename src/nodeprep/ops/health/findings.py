"""A finding (node, stable code, verdict, reason, fix) and a check (a name, the codes it can
give, the facts it reads, a function from those facts to findings)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from enum import IntEnum
from typing import Callable


class Verdict(IntEnum):
    """Worst wins: CRITICAL > UNKNOWN > WARN > OK (a check that could not see is worse than a
    warning: nothing is known)."""

    OK = 0
    WARN = 1
    UNKNOWN = 2
    CRITICAL = 3


@dataclass(frozen=True)
class Finding:
    node: str
    check: str
    code: str  # stable: scripts and --ignore use it
    verdict: Verdict
    reason: str
    fix: str = ""

    def as_dict(self) -> dict:
        return {
            "node": self.node,
            "check": self.check,
            "code": self.code,
            "verdict": self.verdict.name,
            "reason": self.reason,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class CheckSpec:
    """NAME for --check; CODES {code: what it means} for --list-checks and --ignore; FACTS the
    probe must gather; RUN (the node's facts, Context) -> [(code, verdict, reason, fix)];
    FLEET: True when RUN takes every node's facts at once ({node: facts}) and returns
    [(node, code, verdict, reason, fix)]."""

    name: str
    about: str
    _: KW_ONLY
    codes: dict[str, str]
    facts: tuple = ()
    run: Callable = None
    fleet: bool = False
    source: str = ""
    tier: str = "passive"


@dataclass(frozen=True)
class Thresholds:
    """Where a number turns into a verdict; each with its source in docs/health.md."""

    corrected_ecc_warn: int = 1000  # volatile corrected ECC errors since the last reset
    retired_pages_warn: int = 10  # Meta GCM's threshold
    disk_free_warn_gib: float = 5.0
    disk_free_critical_gib: float = 1.0
    disk_used_warn_pct: float = 95.0  # Imbue cluster-health
    mem_available_warn_pct: float = 10.0
    mem_available_critical_gib: float = 1.0
    shm_min_mib: int = 512  # ds_report warns below 512 MiB
    memlock_min_kib: int | None = None  # None: unlimited wanted (NCCL, EFA)
    nofile_min: int = 4096
    clock_warn_s: float = 1.0
    clock_critical_s: float = 30.0
    xid_window_s: float = 7200.0  # azurehpc-health-checks: the last 2 hours


@dataclass
class Context:
    """What a node's checks know besides its own facts."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    clock_window: tuple[float, float] | None = None  # the controller's clock around the probe
    interface: str | None = None  # the interface the node's address is on
    emulate_gpus: int = 0  # --deep --emulate-gpus N: CPU devices stand in
    allreduce_floor_gbps: float | None = None  # the inventory's health_allreduce_floor_gbps


def worst(verdicts) -> Verdict:
    return max(verdicts, default=Verdict.OK)
