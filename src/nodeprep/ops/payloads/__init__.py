"""Built-in training payloads and the job agent: standalone scripts that run on the nodes, not
modules of nodeprep.

They import only the standard library and torch, because they run in the nodes' provisioned
venv where nodeprep is not installed; `invoke train` copies the file and launches it by path.
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent

BUILTIN: dict[str, Path] = {
    "health": _HERE / "health.py",      # init + all_reduce + barrier, one line per rank
    "ddp": _HERE / "ddp.py",            # tiny DDP trainer with snapshot/resume and failure knobs
    "allreduce": _HERE / "allreduce.py",  # all_reduce bus bandwidth per message size
}


def path(name: str) -> Path:
    """The script file of the builtin payload NAME; KeyError if there is none."""
    return BUILTIN[name]


# The job agent (not payloads): every launcher starts RANK around the payload, and one WATCH
# per machine reports the ranks' starts, exits and output to the controller.
RANK = _HERE / "rank.py"
WATCH = _HERE / "watch.py"
