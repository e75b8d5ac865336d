"""`verify-parity --collective`: an all_reduce across every selected node through the real
launcher path (`invoke train` with the builtin `allreduce` payload: job dir sync, preflight,
the launcher, cleanup of every rank on failure), gloo on CPU nodes and nccl on GPU nodes, and
the bus bandwidth per message size that rank 0 measured."""
from __future__ import annotations

import json

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train import Job
from nodeprep.engine.events import Events
from nodeprep.engine.executor import Fleet
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


def collective(opts: TrainOptions, settings: Settings, events: Events) -> dict:
    """OPTS: the train options of the allreduce job (payload allreduce). Returns {'ok',
    'launcher', 'exit', 'world_size', 'backend', 'sizes': [...], 'error'}."""
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    out = {"ok": False, "launcher": opts.launcher}
    try:
        job = Job(opts, inv, hosts, events)
        with Fleet(hosts, settings, "collective", events) as fleet:
            job.prepare(fleet)
            out["exit"] = job.launch(fleet).exit_code
    except NodeprepError as e:
        out["error"] = str(e).splitlines()[0]
        return out
    got = parse([r.stdout for r in job.results.values()])
    if got is None:
        out["error"] = f"no result from rank 0 (launcher exit {out['exit']})"
        return out
    out.update(got)
    out["ok"] = bool(got.get("ok")) and out["exit"] == 0
    return out
