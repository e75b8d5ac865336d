"""The supervisor of a detached run (`train --detach`): `start` spawns
`python -m nodeprep.cli.detached RUN_DIR` in a session of its own (no terminal, stdin closed,
output to RUN_DIR/supervisor.log), so it survives the invoking process and the user's logout.
It reads job.json and settings.json, reconnects to the job's nodes and runs the same
supervisor as an attached run; SIGTERM (`train.stop`) makes it stop every rank first.

The job's processes run under setsid on the nodes: they do not depend on this process. If it
dies, the job runs on unsupervised; `train.status` says so and `train.stop` stops it on the nodes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nodeprep.engine.results import usable
from nodeprep.errors import NodeprepError
from nodeprep.settings import Settings


def start(run_dir: str, settings: Settings, wait: float = 30.0) -> int:
    """Spawn the supervisor and wait until it has written its first state; returns its pid."""
    path = Path(run_dir)
    (path / "settings.json").write_text(json.dumps(dataclasses.asdict(settings)))
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(path / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nodeprep.cli.detached", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if (path / "state.json").exists():
            return proc.pid
        if proc.poll() is not None:
            raise NodeprepError(
                f"the detached supervisor exited ({proc.returncode}) before the job "
                f"started: see {path / 'supervisor.log'}"
            )
        time.sleep(0.2)
    return proc.pid


class _FileEvents:
    """Events of a detached run go to supervisor.log (rank lines are in the bundle already)."""

    def __init__(self, stream):
        self.stream = stream

    def start(self, nodes):
        pass

    def stop(self):
        pass

    def status(self, node, stage, status, message=""):
        if not usable(status):
            self.note(node, f"{stage}: {status} {message}")

    def line(self, node, text):
        pass

    def note(self, node, text):
        self.stream.write(f"{time.strftime('%H:%M:%S')} {node}: {text}\n")
        self.stream.flush()

    def log(self, text):
        self.note("controller", text)


def main(run_dir: str) -> int:
    from nodeprep.commands.common import select_hosts
    from nodeprep.commands.train.runspec import RunSpec
    from nodeprep.commands.train.supervise import Supervisor
    from nodeprep.engine.fleet import Fleet
    from nodeprep.engine.results import RunLog
    from nodeprep.ops.train import rundir

    path = Path(run_dir)
    settings = Settings(**json.loads((path / "settings.json").read_text()))
    spec = RunSpec.load(rundir.read_json(path / "job.json"))
    events = _FileEvents(sys.stdout)
    _inv, hosts = select_hosts(spec.inventory, spec.limit, settings, events=events)
    hosts = [h for h in hosts if h.name in spec.nodes]
    files = rundir.RunDir(path)
    with Fleet(hosts, settings, "train", events, runlog=RunLog(path)) as fleet:
        sup = Supervisor(spec, fleet, events, files)
        signal.signal(signal.SIGTERM, lambda *_: setattr(sup, "stop_requested", "stopped"))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        out = sup.run()
    files.close()
    events.note(
        "controller",
        f"job {spec.job_id}: {out.state}" + (f": {out.failure}" if out.failure else ""),
    )
    return _restarts(path, out, settings, events)


def _restarts(path: Path, out, settings: Settings, events) -> int:
    """--restarts: the rest of the job's attempts, run here as an attached train runs them;
    SIGTERM (`train.stop` of any of its runs) from now on ends them as Ctrl-C would."""
    from nodeprep.commands.train import run as run_cmd

    def ctrl_c(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, ctrl_c)
    try:
        res = run_cmd.go_on_detached(path, out, settings, events)
    except KeyboardInterrupt:
        return 130
    if res is None:
        return 0 if out.failure is None else 1
    for a in res.attempts:
        events.note(
            "controller",
            f"attempt {a['attempt']} (job {a['job_id']}): "
            + (a["cause"]["line"] if a.get("cause") else "finished"),
        )
    if res.stop_reason and res.stop_reason != "finished":
        events.note("controller", f"no further attempt: {res.stop_reason}")
    return res.exit_code


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1]))
    except NodeprepError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
