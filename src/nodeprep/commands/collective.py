"""`verify-parity --collective`: an all_reduce across every selected node through the real
launcher path (`invoke train` with the builtin `allreduce` payload: job dir sync, preflight,
the launcher, cleanup of every rank on failure), gloo on CPU nodes and nccl on GPU nodes, and
the bus bandwidth per message size that rank 0 measured."""
from __future__ import annotations

import json

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train import Job, supervise
from nodeprep.engine.events import Events
from nodeprep.engine.executor import Fleet
from nodeprep.engine.results import RunLog
from nodeprep.ops import bundle
from nodeprep.errors import NodeprepError
from nodeprep.settings import Settings

MARK = "allreduce-json: "


def parse(outputs: list[str]) -> dict | None:
    """The JSON line rank 0 printed, from whichever node ran rank 0."""
    for text in outputs:
        for line in text.splitlines():
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
    return None


class _Lines(Events):
    """Passes every event on, and keeps the ranks' lines (rank 0 prints the result)."""

    def __init__(self, inner: Events):
        self.inner, self.seen = inner, []

    def start(self, nodes):
        self.inner.start(nodes)

    def stop(self):
        self.inner.stop()

    def status(self, node, stage, status, message=""):
        self.inner.status(node, stage, status, message)

    def line(self, node, text):
        self.seen.append(text)
        self.inner.line(node, text)

    def note(self, node, text):
        self.inner.note(node, text)

    def log(self, text):
        self.inner.log(text)


def collective(opts: TrainOptions, settings: Settings, events: Events) -> dict:
    """OPTS: the train options of the allreduce job (payload allreduce). Returns {'ok',
    'launcher', 'exit', 'world_size', 'backend', 'sizes': [...], 'error'}."""
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    out = {"ok": False, "launcher": opts.launcher}
    lines = _Lines(events)
    try:
        job = Job(opts, inv, hosts, lines)
        run_dir = bundle.run_path(settings.runs, job.id)
        with Fleet(hosts, settings, "collective", lines, runlog=RunLog(run_dir)) as fleet:
            job.prepare(fleet)
            outcome = supervise(job.spec(settings), fleet, lines, run_dir)
            out["exit"] = 0 if outcome.failure is None else 1
    except NodeprepError as e:
        out["error"] = str(e).splitlines()[0]
        return out
    got = parse(["\n".join(lines.seen)])
    if got is None:
        out["error"] = f"no result from rank 0 (launcher exit {out['exit']})"
        return out
    out.update(got)
    out["ok"] = bool(got.get("ok")) and out["exit"] == 0
    return out
