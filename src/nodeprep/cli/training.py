"""The cli's training entry points: `train` (the job to its end, or detached; its timeline
drawn with --png; SIGTERM taken as Ctrl-C), `train.status`, `train.stop`, `train.release`,
`train.logs`."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time

from nodeprep.cli import stdio
from nodeprep.cli.display import Display
from nodeprep.cli.guard import guarded, need_matplotlib, print_json
from nodeprep.commands.options import ReleaseOptions, RunsOptions, TrainOptions
from nodeprep.errors import InputError
from nodeprep.settings import Settings


@guarded
def train(opts: TrainOptions, settings: Settings = Settings()) -> int:
    from nodeprep.cli import detached, render
    from nodeprep.commands import train as train_cmd

    need_matplotlib(opts.png)
    with _term_as_ctrl_c():
        res = train_cmd.train(opts, settings, Display.auto(quiet=True))
    if res.detached:
        detached.start(res.run_dir, settings)
    render.train(res)
    if opts.png and res.launched and not res.detached:
        _timeline(res.run_dir, res.job_id, opts.png)
    return res.exit_code


@contextlib.contextmanager
def _term_as_ctrl_c():
    """An attached train's SIGTERM (what `invoke train.stop` sends the pid in state.json) ends
    it as Ctrl-C does: every rank stopped, and no further attempt under --restarts. Only in
    the main thread (signals are delivered there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ctrl_c(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _timeline(run_dir: str, job_id: str, path: str) -> None:
    """The job's timeline (cli/timeline.py) at PATH, said on stderr."""
    from pathlib import Path

    from nodeprep.cli import timeline
    from nodeprep.ops.train import rundir

    attempts = rundir.attempts(Path(run_dir))
    if not attempts or attempts[0].get("started") is None:
        raise InputError(f"--png: run {job_id} records no start time to draw from")
    timeline.png(attempts, path, f"job {attempts[0]['job_id']}: {len(attempts)} attempt(s)")
    print(f"timeline: {path}", file=sys.stderr)


@guarded
def train_status(opts: RunsOptions, settings: Settings = Settings()) -> int:
    from nodeprep.cli import render
    from nodeprep.commands.train import control as control_cmd

    need_matplotlib(opts.png)
    st = control_cmd.status(opts, settings, Display.auto(to_stderr=True, quiet=True))
    if opts.json:
        print_json(st.__dict__)
    else:
        render.train_status(st)
    if opts.png:
        _timeline(st.path, st.job_id, opts.png)
    return st.exit_code


@guarded
def train_stop(opts: RunsOptions, settings: Settings = Settings()) -> int:
    from nodeprep.cli import render
    from nodeprep.commands.train import control as control_cmd

    res = control_cmd.stop(opts, settings, Display.auto(to_stderr=True, quiet=True))
    render.train_stop(res)
    return res.exit_code


@guarded
def train_release(opts: ReleaseOptions, settings: Settings = Settings()) -> int:
    from nodeprep.cli import render
    from nodeprep.commands.train import control as control_cmd

    res = control_cmd.release(opts, settings)
    render.train_release(res)
    return res.exit_code


@guarded
def train_logs(opts: RunsOptions, settings: Settings = Settings()) -> int:
    from nodeprep.ops.train import rundir

    path = rundir.find(settings.runs, opts.run)
    offsets: dict = {}
    while True:
        for label, line in rundir.log_lines(path, opts.node, opts.rank, offsets):
            print(f"[{label}] {line}", flush=opts.follow)
        if not opts.follow or rundir.finished(path) or stdio.stdout_lost():
            break
        time.sleep(0.5)
    for label, line in rundir.log_lines(path, opts.node, opts.rank, offsets):
        print(f"[{label}] {line}")  # what came after the last poll
    return 0
