"""Per-node results and the run directory (a log per node per stage + report.json). How they
are shown is the cli's business (nodeprep/cli/)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Worse statuses win when a node reports several.
_RANK = {"ok": 0, "skipped": 0, "changed": 1, "failed": 2, "unreachable": 3}


def usable(status: str) -> bool:
    """The one rule for a node's status: later stages still run on it (not failed, not
    unreachable). NodeResult.usable and Fleet.usable() ask this; so do reports read back."""
    return status not in ("failed", "unreachable")


@dataclass
class StepResult:
    name: str
    status: str  # ok | changed | failed | skipped
    message: str = ""

    def as_dict(self) -> dict:
        return {"step": self.name, "status": self.status, "message": self.message}


@dataclass
class NodeResult:
    node: str
    status: str = "ok"
    message: str = ""
    stderr_tail: str = ""
    steps: list[StepResult] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    error_kind: str = (
        ""  # the exception's class that failed the node (HostKeyChanged, AuthFailed, ...)
    )
    interrupted: bool = False  # Ctrl-C: what it was doing is the message; later noise is not

    @property
    def usable(self) -> bool:
        """Whether later stages still run on this node (the one rule: not failed, not
        unreachable)."""
        return usable(self.status)

    @property
    def changed(self) -> int:
        return sum(s.status == "changed" for s in self.steps)

    @property
    def failed(self) -> int:
        n = sum(s.status == "failed" for s in self.steps)
        return n or int(self.status == "failed")

    def mark(self, status: str, message: str = "", stderr_tail: str = "") -> None:
        if self.interrupted:
            return
        if _RANK[status] >= _RANK[self.status]:
            self.status = status
            self.message = message or self.message
            self.stderr_tail = stderr_tail or self.stderr_tail

    def add_step(self, step: StepResult, stderr_tail: str = "") -> None:
        self.steps.append(step)
        if step.status in ("changed", "failed"):
            self.mark(
                step.status,
                f"{step.name}: {step.message}" if step.status == "failed" else "",
                stderr_tail,
            )

    def as_dict(self) -> dict:
        d = {"status": self.status, "changed": self.changed, "failed": self.failed}
        if self.message:
            d["message"] = self.message
        if self.stderr_tail:
            d["stderr_tail"] = self.stderr_tail
        if self.steps:
            d["steps"] = [s.as_dict() for s in self.steps]
        if self.data:
            d.update(self.data)
        return d


def summarize(results: dict[str, NodeResult]) -> dict:
    return {
        "nodes": {n: r.as_dict() for n, r in results.items()},
        "changed": sum(r.changed for r in results.values()),
        "failed": sum(r.status == "failed" for r in results.values()),
        "unreachable": sum(r.status == "unreachable" for r in results.values()),
    }


class RunLog:
    """`<runs>/<stamp>-<task>/<node>/<stage>.log` and `report.json`; `<runs>/latest` points
    at the newest run."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._files: dict[tuple[str, str], object] = {}
        self._lock = threading.Lock()

    @classmethod
    def create(cls, runs: Path, task: str) -> "RunLog":
        # A directory of its own, even for a second run of the same task by the same process
        # within the same second (they used to share one and interleave their logs).
        base = f"{time.strftime('%Y%m%d-%H%M%S')}-{task}-{os.getpid()}"
        runs.mkdir(parents=True, exist_ok=True)
        path, n = runs / base, 1
        while True:
            try:
                path.mkdir()
                break
            except FileExistsError:
                n += 1
                path = runs / f"{base}.{n}"
        latest = runs / "latest"
        try:
            tmp = runs / f".latest-{path.name}"
            tmp.symlink_to(path.name)
            os.replace(tmp, latest)
        except OSError:
            pass
        return cls(path)

    def node_log(self, node: str, stage: str):
        key = (node, stage)
        with self._lock:
            fh = self._files.get(key)
            if fh is None:
                d = self.path / node
                d.mkdir(exist_ok=True)
                fh = self._files[key] = open(d / f"{stage}.log", "a", buffering=1)
            return fh

    def close(self, node: str, stage: str) -> None:
        """The node is done with STAGE for now (a later write opens it again, appending)."""
        with self._lock:
            fh = self._files.pop((node, stage), None)
        if fh is not None:
            fh.close()

    def write_report(self, results: dict[str, NodeResult], **extra) -> dict:
        report = summarize(results)
        report.update(extra)
        report["run_dir"] = str(self.path)
        (self.path / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()
        return report
