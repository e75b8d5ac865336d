"""`train.status`, `train.stop`: training runs as the controller's run directory records them
(ops/train/rundir.py), checked against the nodes (the job's processes on each). `train.logs`
reads the run directory alone (rundir.log_lines, rundir.finished)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import ReleaseOptions, RunsOptions
from nodeprep.commands.train import containers
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.results import RunLog
from nodeprep.errors import InputError
from nodeprep.ops.train import processes, quarantine, rundir
from nodeprep.settings import Settings


@dataclass
class RunStatus:
    job_id: str
    path: str
    state: str  # running | finished | failed | stopped | orphaned
    _: KW_ONLY
    launcher: str = ""
    where: str = ""
    elapsed: float = 0.0
    nodes: dict = field(default_factory=dict)  # node -> {alive, ranks, last}
    processes: dict = field(default_factory=dict)  # node -> processes of the job now (checked)
    unreachable: dict = field(default_factory=dict)
    failure: str | None = None
    cause: dict | None = None  # the failure's class (ops/train/causes.py)
    supervisor: bool = False
    attempts: list = field(default_factory=list)  # the job's attempts (rundir.attempts)

    @property
    def exit_code(self) -> int:
        return 0


def _job_hosts(spec: dict, settings: Settings, events: Events):
    _inv, hosts = select_hosts(spec.get("inventory"), spec.get("limit"), settings, events=events)
    return [h for h in hosts if h.name in spec.get("nodes", [])]


def _processes(spec: dict, path: Path, settings: Settings, events: Events) -> tuple[dict, dict]:
    hosts = _job_hosts(spec, settings, events)
    with Fleet(hosts, settings, "train-status", events, runlog=RunLog(path / "status")) as fleet:
        got = fleet.map(lambda s: factmod.gather(s, [factmod.JOB_PROCESSES]), "check")
        bad = fleet.unusable()
    return (
        {
            n: [p for p in v[factmod.JOB_PROCESSES] if p["job"] == spec["job_id"]]
            for n, v in got.items()
        },
        bad,
    )


def status(opts: RunsOptions, settings: Settings, events: Events) -> RunStatus:
    path = rundir.find(settings.runs, opts.run)
    spec = rundir.read_json(path / "job.json")
    state = rundir.read_json(path / "state.json")
    st = RunStatus(
        spec.get("job_id", path.name),
        str(path),
        state.get("state", "starting"),
        launcher=spec.get("launcher", ""),
        where=spec.get("where", ""),
    )
    st.supervisor = rundir.supervisor_alive(state)
    st.elapsed = (
        state.get("updated", time.time()) if not st.supervisor else time.time()
    ) - state.get("started", time.time())
    st.nodes = state.get("nodes", {})
    st.failure = (state.get("outcome") or {}).get("failure")
    st.cause = (state.get("outcome") or {}).get("cause")
    st.attempts = rundir.attempts(path)
    st.processes, st.unreachable = _processes(spec, path, settings, events)
    if st.state not in rundir.FINAL and not st.supervisor:
        # the supervisor is gone (killed, machine rebooted): what the nodes say is the truth
        st.state = "orphaned" if any(st.processes.values()) else "ended (unsupervised)"
    return st


@dataclass
class StopResult:
    job_id: str
    how: str  # "asked the supervisor", "stopped on the nodes"
    stopped: dict = field(default_factory=dict)
    state: str = ""

    @property
    def exit_code(self) -> int:
        return 0


def stop(opts: RunsOptions, settings: Settings, events: Events, wait: float = 60.0) -> StopResult:
    if not opts.run:
        raise InputError(
            "train.stop needs the run id", hint="`invoke train.status` lists the newest run"
        )
    path = rundir.find(settings.runs, opts.run)
    spec = rundir.read_json(path / "job.json")
    state = rundir.read_json(path / "state.json")
    loop = rundir.loop_pid(path) if not rundir.supervisor_alive(state) else None
    if loop:  # a --restarts job between attempts, or past this one: its loop stops it all
        with contextlib.suppress(ProcessLookupError):
            os.kill(loop, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and rundir.loop_pid(path):
            time.sleep(0.3)
        gone = rundir.loop_pid(path) is None
        return StopResult(
            spec["job_id"],
            "the job's restart loop " + ("stopped it" if gone else f"still runs after {wait:g}s"),
            state="stopped" if gone else "stopping",
        )
    if rundir.supervisor_alive(state):
        os.kill(int(state["pid"]), signal.SIGTERM)  # it stops every rank, then writes its result
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            now = rundir.read_json(path / "state.json")
            if now.get("state") in rundir.FINAL:
                return StopResult(
                    spec["job_id"], "the supervisor stopped the job", state=now["state"]
                )
            time.sleep(0.3)
    hosts = _job_hosts(spec, settings, events)
    script = processes.cleanup_script(spec["job_id"])
    with Fleet(hosts, settings, "train-stop", events, runlog=RunLog(path / "stop")) as fleet:
        out = fleet.map(
            lambda s: s.run(script, timeout=30, label="stop job").stdout.strip(), "stop"
        )
        # the container way: the job's containers go too (the supervisor would have removed
        # them; it is gone)
        containers.remove(spec.get("containers") or {}, fleet)
        out.update({n: "unreachable: " + why for n, why in fleet.unusable().items()})
    return StopResult(spec["job_id"], "stopped on the nodes", out, state.get("state", ""))


@dataclass
class ReleaseResult:
    released: list[str] = field(default_factory=list)
    held: dict = field(default_factory=dict)  # node -> its record, still quarantined

    @property
    def exit_code(self) -> int:
        return 0


def release(opts: ReleaseOptions, settings: Settings) -> ReleaseResult:
    """Quarantined nodes back in service; a named node that is not quarantined is bad input."""
    if opts.all or opts.nodes:
        done, unknown = quarantine.release(settings.state, ["*"] if opts.all else list(opts.nodes))
        if unknown:
            held = ", ".join(quarantine.load(settings.state)) or "none"
            raise InputError(
                f"train.release: {', '.join(unknown)} not quarantined (quarantined: {held})"
                + (f"; released {', '.join(done)}" if done else "")
            )
        return ReleaseResult(done, quarantine.load(settings.state))
    return ReleaseResult([], quarantine.load(settings.state))
