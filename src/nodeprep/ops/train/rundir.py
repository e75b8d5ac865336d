"""A training run's directory on the controller (`<state>/runs/train-<job id>/`), written while
the job runs and read by `train.status` and `train.logs`:

  job.json            what was launched: nodes, launcher command lines, environment (secrets
                      redacted), each node's torch/NCCL versions
  state.json          running | finished | failed | stopped, per node ranks alive and last line,
                      the supervisor's pid (a detached run), updated every second
  output.log          every line as the terminal shows it: `[worker-1 r3] text`
  nodes/<node>/r<R>.out, .err, .stack   per rank; nodes/<node>/launcher.out
  exits.json          every rank's end: status or signal, OOM, how (failed, stopped by nodeprep)
  attempts.json       train --restarts: every attempt of the job so far (in each attempt's run)
  summary.txt         the result, root cause first
  engine logs         <node>/<stage>.log, report.json (engine/results.RunLog)
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

from nodeprep.errors import InputError

PREFIX = "train-"
FINAL = ("finished", "failed", "stopped")


def run_path(runs: Path, job_id: str) -> Path:
    return runs / f"{PREFIX}{job_id}"


def split_prefix(prefix: str) -> tuple[str, int | None]:
    """'worker-1 r3' -> ('worker-1', 3); 'worker-0' -> ('worker-0', None)."""
    m = re.match(r"(.+) r(\d+)$", prefix)
    return (m.group(1), int(m.group(2))) if m else (prefix, None)


class RunDir:
    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._files: dict[Path, object] = {}
        (path / "nodes").mkdir(parents=True, exist_ok=True)

    def _fh(self, rel: Path):
        fh = self._files.get(rel)
        if fh is None:
            (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
            fh = self._files[rel] = open(self.path / rel, "a", buffering=1, errors="replace")
        return fh

    def line(self, prefix: str, src: str, text: str) -> None:
        node, rank = split_prefix(prefix)
        name = f"r{rank}.{src}" if rank is not None else "launcher.out"
        with self._lock:
            self._fh(Path("nodes") / node / name).write(text + "\n")
            if src != "stack":
                self._fh(Path("output.log")).write(f"[{prefix}] {text}\n")

    def write_json(self, name: str, data) -> None:
        tmp = self.path / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path / name)

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text)

    def close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def attempts(path: Path) -> list[dict]:
    """The job's attempts as attempts.json lists them (train --restarts), else the run at PATH
    as its one attempt from job.json and state.json: attempt, job_id, nodes, cause, started,
    ended (seconds since the epoch; ended None while it runs)."""
    listed = read_json(path / "attempts.json")
    if isinstance(listed, list):
        return listed
    spec, state = read_json(path / "job.json"), read_json(path / "state.json")
    outcome = state.get("outcome") or {}
    return [
        {
            "attempt": 1,
            "job_id": spec.get("job_id", path.name[len(PREFIX) :]),
            "nodes": list(spec.get("nodes") or state.get("nodes") or []),
            "failure": outcome.get("failure"),
            "cause": outcome.get("cause"),
            "quarantined": {},
            "spares": {},
            "started": state.get("started"),
            "ended": state.get("updated") if state.get("state") in FINAL else None,
        }
    ]


def runs_of(runs: Path) -> list[Path]:
    """Training runs, oldest first (job ids start with their start time)."""
    if not runs.is_dir():
        return []
    return sorted(
        (p for p in runs.iterdir() if p.name.startswith(PREFIX) and (p / "job.json").exists()),
        key=lambda p: p.name,
    )


def find(runs: Path, run: str | None) -> Path:
    """RUN (a job id, a unique prefix of one, or None for the newest) -> its directory."""
    all_runs = runs_of(runs)
    if not all_runs:
        raise InputError(f"no training runs under {runs}", hint="start one with `invoke train`")
    if not run:
        return all_runs[-1]
    hits = [p for p in all_runs if p.name[len(PREFIX) :].startswith(run)]
    if len(hits) != 1:
        known = ", ".join(p.name[len(PREFIX) :] for p in all_runs[-5:])
        raise InputError(
            f"run {run!r}: {'no' if not hits else 'more than one'} run matches",
            hint=f"recent runs: {known}",
        )
    return hits[0]


def log_files(path: Path, node: str | None = None, rank: int | None = None) -> list[Path]:
    """The per-rank and launcher logs of a run, filtered by node and rank."""
    out = []
    for d in sorted((path / "nodes").glob("*")):
        if node and d.name != node:
            continue
        for f in sorted(d.iterdir()):
            m = re.match(r"r(\d+)\.", f.name)
            if rank is not None and (not m or int(m.group(1)) != rank):
                continue
            out.append(f)
    return out


def log_lines(
    path: Path, node: str | None, rank: int | None, offsets: dict
) -> list[tuple[str, str]]:
    """New lines of the run's logs since OFFSETS (updated): (file label, line)."""
    out = []
    for f in log_files(path, node, rank):
        key = str(f)
        try:
            with open(f, "rb") as fh:
                fh.seek(offsets.get(key, 0))
                data = fh.read()
        except OSError:
            continue
        complete = data[: data.rfind(b"\n") + 1]
        offsets[key] = offsets.get(key, 0) + len(complete)
        label = f"{f.parent.name} {f.stem}" if f.stem.startswith("r") else f.parent.name
        out += [(label, ln) for ln in complete.decode("utf-8", "replace").splitlines()]
    return out


def finished(path: Path) -> bool:
    """Is the run over: a final state, or no supervisor left to change it?"""
    state = read_json(path / "state.json")
    return state.get("state") in FINAL or not supervisor_alive(state)


def supervisor_alive(state: dict) -> bool:
    """Does state.json's supervisor (a detached run's pid) still run on this controller?"""
    pid = state.get("pid")
    if not pid or state.get("state") in FINAL:
        return False
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True


def proc_start(pid: int) -> str | None:
    """When process PID started (clock ticks since boot, /proc/PID/stat's 22nd field): with the
    pid, what names one process (a pid is reused; a pid and its start time are not)."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError, TypeError):
        return None
    return stat.rpartition(")")[2].split()[19]


def loop_pid(path: Path) -> int | None:
    """The pid of the `train --restarts` loop whose attempt ran at PATH (restarts.json: its pid
    and start time, cleared when the loop ends), while that very process runs; else None."""
    rec = read_json(path / "restarts.json")
    pid, since = rec.get("pid"), rec.get("since")
    return int(pid) if pid and since and proc_start(pid) == since else None
