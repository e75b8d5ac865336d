"""A job's processes on a node. Every process of a job carries JOB_VAR=<id> in its environment
(engine/facts/jobs.py: the JOB_PROCESSES fact lists them), so the cleanup stops the process
groups of exactly those processes on every node, never a broad `pkill -f`; processes of an
EARLIER job are stale (a half-dead job still holding GPUs)."""

from __future__ import annotations

from nodeprep.engine.facts.jobs import JOB_VAR
from nodeprep.engine.remote import stop_tagged_script


def cleanup_script(job_id: str) -> str:
    """sh that stops every process group holding a process of JOB_ID on this node."""
    return stop_tagged_script(JOB_VAR, job_id)


def stale(procs: list[dict], job_id: str) -> dict[str, list[dict]]:
    """Processes of earlier jobs, by job id."""
    out: dict[str, list[dict]] = {}
    for p in procs:
        if p["job"] != job_id:
            out.setdefault(p["job"], []).append(p)
    return out
