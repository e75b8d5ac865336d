"""Open files a run needs: one socket per node for the whole run, plus the log files and
pipes of the nodes being worked on. Linux sessions often start with a soft limit of 1024
descriptors (systemd's default) under a hard limit of 500k or more: a run over a thousand
nodes would die with "Too many open files" halfway. The soft limit is raised towards the hard
one as far as the fleet needs; it can never go above the hard limit (that needs root)."""

from __future__ import annotations

import resource

PER_NODE = 4  # its socket, paramiko's pipes, a stage log open while the node works
BASE = 256  # the interpreter, imports, the controller's own files


def ensure_open_files(nodes: int) -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to what NODES need (capped by the hard limit).
    Returns (soft limit now, what was wanted): a caller may warn when soft < wanted."""
    want = BASE + PER_NODE * nodes
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return soft, want
