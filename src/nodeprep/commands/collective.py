"""`verify-parity --collective`: an all_reduce across every selected node through the real
launcher path (`invoke train` with the builtin `allreduce` payload: job dir sync, preflight,
the launcher, cleanup of every rank on failure), gloo on CPU nodes and nccl on GPU nodes, and
the bus bandwidth per message size that rank 0 measured.

With nccl the ranks run with NCCL_DEBUG=INFO (subsystems INIT,NET): NCCL's own log is the only
place that says which net plugin it loaded (aws-ofi-nccl or none), which network and which
transports it used. Each node's lines go through ops/verify/nccllog; verify-parity compares the
answers like any other key. Those lines stay in the run's bundle, off the screen."""

from __future__ import annotations

import json

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import TrainOptions
from nodeprep.commands.train.launch import run_spec, supervise
from nodeprep.commands.train.prepare import new_job_id, prepare
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.engine.results import RunLog
from nodeprep.errors import NodeprepError
from nodeprep.ops.train import rundir
from nodeprep.ops.verify import nccllog
from nodeprep.settings import Settings

MARK = "allreduce-json: "
# NCCL_DEBUG_FILE would take the log away from the ranks' output, where it is read
NCCL_LOG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
NCCL_EXPORT = "export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET; unset NCCL_DEBUG_FILE; "


def parse(outputs: list[str]) -> dict | None:
    """The JSON line rank 0 printed, from whichever node ran rank 0."""
    for text in outputs:
        for line in text.splitlines():
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
    return None


def by_node(seen: list[tuple[str, str]]) -> dict[str, dict]:
    """(prefix, line) pairs as the supervisor shows them ("worker-1 r3", "worker-1") -> what
    NCCL's log said on each node (nccllog.parse); nodes where it said nothing are left out."""
    lines: dict[str, list[str]] = {}
    for prefix, text in seen:
        lines.setdefault(rundir.split_prefix(prefix)[0], []).append(text)
    parsed = {node: nccllog.parse(texts) for node, texts in lines.items()}
    return {node: got for node, got in parsed.items() if got}


def uses_nccl(prep) -> bool:
    """The allreduce payload takes nccl where torch.cuda.is_available(), as the probe saw it
    (PREP: the train command's Prepared job)."""
    return any(
        (f.get(factmod.TORCH_BUILD(factmod.TorchIn(prep.vars[n]["venv_path"]))) or {}).get(
            "available"
        )
        for n, f in prep.facts.items()
    )


class _Lines(Events):
    """Passes every event on but NCCL's INFO lines (the bundle keeps them), and keeps the
    ranks' lines (rank 0 prints the result; NCCL logs its plugin, network, transports)."""

    def __init__(self, inner: Events):
        self.inner, self.seen = inner, []

    def start(self, nodes):
        self.inner.start(nodes)

    def stop(self):
        self.inner.stop()

    def status(self, node, stage, status, message=""):
        self.inner.status(node, stage, status, message)

    def line(self, node, text):
        self.seen.append((node, text))
        if " NCCL INFO " not in text:
            self.inner.line(node, text)

    def note(self, node, text):
        self.inner.note(node, text)

    def log(self, text):
        self.inner.log(text)


def collective(opts: TrainOptions, settings: Settings, events: Events) -> dict:
    """OPTS: the train options of the allreduce job (payload allreduce). Returns {'ok',
    'launcher', 'exit', 'world_size', 'backend', 'sizes': [...], 'error'}, and with nccl
    'nccl': {node: what NCCL's log said there} (nccllog.parse)."""
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    out = {"ok": False, "launcher": opts.launcher}
    lines = _Lines(events)
    try:
        job_id = new_job_id()
        run_dir = rundir.run_path(settings.runs, job_id)
        with Fleet(hosts, settings, "collective", lines, runlog=RunLog(run_dir)) as fleet:
            prep = prepare(opts, inv, hosts, fleet, lines, job_id)
            spec = run_spec(prep, opts)
            if uses_nccl(prep):
                spec.commands = {
                    label: [node, NCCL_EXPORT + cmd] for label, (node, cmd) in spec.commands.items()
                }
                spec.env.update(NCCL_LOG)
            outcome = supervise(spec, fleet, lines, run_dir)
            out["exit"] = 0 if outcome.failure is None else 1
    except NodeprepError as e:
        out["error"] = str(e).splitlines()[0]
        return out
    logged = by_node(lines.seen)
    if logged:
        out["nccl"] = logged
    got = parse(["\n".join(text for _node, text in lines.seen)])
    if got is None:
        out["error"] = f"no result from rank 0 (launcher exit {out['exit']})"
        return out
    out.update(got)
    out["ok"] = bool(got.get("ok")) and out["exit"] == 0
    return out
