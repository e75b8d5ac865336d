"""What a supervised run is and how it ended: the RunSpec (everything the supervisor needs,
saved as the run's job.json, which a detached supervisor reads back) and the Outcome
(supervise.py fills it in), and the launchers' environment as job.json keeps it (redacted)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from nodeprep.redact import MASK, is_secret


@dataclass
class RunSpec:
    """Everything the supervisor needs, saved as job.json: a detached supervisor reads it."""

    job_id: str
    launcher: str
    where: str
    _: KW_ONLY
    inventory: str | None
    limit: str | None
    nodes: list[str]  # inventory nodes of the job
    commands: dict[str, list[str]]  # launcher label -> [node it runs on, command]
    watchers: dict[str, list[str]]  # machine's node -> [python, agent dir]
    layout: list[list] | None  # [[label, ranks], ...] in rank order; None: torchrun
    names: list[str] = field(default_factory=list)  # labels (emulated names included)
    restarts: bool = False
    hang_timeout: float | None = None
    timeout: float | None = None
    ranks_shown: list[int] | None = None
    machine_of: dict = field(
        default_factory=dict
    )  # node -> the node whose watcher covers its machine
    versions: dict = field(default_factory=dict)  # node -> torch / NCCL versions
    env: dict = field(default_factory=dict)  # what the launchers export (redacted)
    # the container way: node -> {start, remove, left: sh; inside: the exec prefix (sh text)}
    containers: dict = field(default_factory=dict)
    addresses: dict = field(default_factory=dict)  # an address ssh may name -> its node

    def label_of(self, rank: int, rec: dict) -> str:
        if rec.get("node"):
            return rec["node"]
        if self.layout:
            n = 0
            for label, count in self.layout:
                n += int(count)
                if rank < n:
                    return label
        return rec.get("host") or "?"

    @classmethod
    def load(cls, data: dict) -> "RunSpec":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Outcome:
    failure: str | None = None  # the root cause, one line
    root: dict | None = None
    others: list[str] = field(default_factory=list)  # later failures (consequences)
    stopped: list[str] = field(default_factory=list)  # ranks nodeprep stopped
    tails: dict = field(default_factory=dict)  # who -> last lines
    leftovers: dict = field(default_factory=dict)  # node -> processes of the job left
    checked: int = 0  # nodes checked for leftovers
    stop_seconds: float | None = None
    ranks: dict = field(default_factory=dict)  # "worker-1 r3" -> how it ended
    warnings: list[str] = field(default_factory=list)  # e.g. a finished rank's teardown crash
    pace: dict = field(default_factory=dict)  # node -> its watcher's tick interval (s)
    cause: dict | None = None  # the root cause's class and blamed node (ops/train/causes.py)
    state: str = "finished"


def redacted_env(env: dict) -> dict:
    return {k: MASK if is_secret(k) else str(v) for k, v in env.items()}
