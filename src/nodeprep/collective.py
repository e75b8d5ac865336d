"""`verify-parity --collective`: an all_reduce across every selected node through the real
launcher path (`invoke train` with the builtin `allreduce` payload: job dir sync, preflight,
the launcher, cleanup of every rank on failure), gloo on CPU nodes and nccl on GPU nodes, and
the bus bandwidth per message size that rank 0 measured."""
from __future__ import annotations

import json

from .errors import NodeprepError
from .report import Display

MARK = "allreduce-json: "


def parse(outputs: list[str]) -> dict | None:
    """The JSON line rank 0 printed, from whichever node ran rank 0."""
    for text in outputs:
        for line in text.splitlines():
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
    return None


def run(inv, hosts, settings, launcher: str = "torchrun", port: int = 29500,
        timeout: int = 300) -> dict:
    """{'ok', 'launcher', 'exit', 'world_size', 'backend', 'sizes': [...], 'error'}."""
    from . import train
    job = train.Job(inv, hosts, settings, launcher, "allreduce", [], timeout, 0, port, "pdsh", True,
                    display=Display.auto(to_stderr=True, quiet=True))
    out = {"ok": False, "launcher": launcher}
    try:
        with train.Fleet(hosts, settings, "collective", job.display) as fleet:
            job.prepare(fleet)
            out["exit"] = job.launch(fleet)
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


def render(res: dict) -> str:
    head = f"collective all_reduce via {res['launcher']}"
    if res.get("error"):
        return f"{head}: FAILED: {res['error']}"
    lines = [f"{head}: {'OK' if res['ok'] else 'FAILED'} (world size {res['world_size']}, "
             f"{res['backend']})",
             f"  {'bytes':>10}  {'time/call':>12}  {'algbw':>11}  {'busbw':>11}"]
    for r in res.get("sizes", []):
        lines.append(f"  {r['bytes']:>10}  {r['time_us']:>9.1f} us  {r['algbw_gbps']:>6.4g} GB/s  "
                     f"{r['busbw_gbps']:>6.4g} GB/s" + ("" if r["correct"] else "  WRONG RESULT"))
    return "\n".join(lines)
