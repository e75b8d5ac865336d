"""What a launch needs to know of a node's processes and programs:

JOB_PROCESSES  processes of nodeprep jobs (every one carries JOB_VAR=<job id> in its
               environment): stale ones before a launch, leftovers after a run
GPU_APPS       processes holding a GPU (nvidia-smi --query-compute-apps)
PROGRAMS       the launchers' programs on the PATH a non-interactive ssh login gets
"""

from __future__ import annotations

from nodeprep.engine.facts.probe import Fact

# In the environment of every process of a job: DeepSpeed's runner forwards PYTHON* variables
# to every rank, mpirun gets -x, torchrun inherits it (nodeside/rank.py reads it too).
JOB_VAR = "PYTHON_NODEPREP_JOB"
# The attempt of a job `train --restarts` relaunched (1, 2, ...), carried the same way; the rank
# wrapper gives the script NODEPREP_RESTART (0 on the first launch) and adds it to torchrun's
# TORCHELASTIC_RESTART_COUNT.
RESTART_VAR = "PYTHON_NODEPREP_RESTART"

# Every process of a job carries JOB_VAR in its environment: before a launch, those of EARLIER
# jobs are stale (a half-dead job still holding GPUs); after a run, those of THIS job are left
# over. One /proc scan lists them all: pid, job id, state, command line.
_PROCS = r"""
myns=$(readlink /proc/self/ns/net 2>/dev/null)
# one grep over every environ (a fork per process cost 0.4 s on a busy machine)
for f in $(grep -lz '^PYTHON_NODEPREP_JOB=' /proc/[0-9]*/environ 2>/dev/null); do
  p=${f%/environ}; pid=${p#/proc/}; [ "$pid" = "$$" ] && continue
  # this node's own: one network namespace (the lab's nodes share one process table)
  [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$myns" ] || continue
  job=$(tr '\0' '\n' < "$p/environ" 2>/dev/null | sed -n 's/^PYTHON_NODEPREP_JOB=//p' | head -n 1)
  [ -z "$job" ] && continue
  st=$(cut -d')' -f2 "$p/stat" 2>/dev/null | cut -d' ' -f2)
  [ "$st" = Z ] && continue
  args=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null | cut -c1-200)
  printf '%s\t%s\t%s\n' "$pid" "$job" "$args"
done
"""


def _procs(text: str, rc: int) -> list[dict]:
    out = []
    for line in text.splitlines():
        pid, _, rest = line.partition("\t")
        job, _, args = rest.partition("\t")
        if pid.isdigit() and job:
            out.append({"pid": int(pid), "job": job, "args": args.strip()})
    return out


JOB_PROCESSES = Fact("job_processes", lambda _v: _PROCS, _procs)


def _gpu_apps(text: str, rc: int) -> list[dict]:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader`."""
    out = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            out.append({"pid": int(parts[0]), "name": parts[1], "memory": parts[2]})
    return out


# processes holding a GPU (none where there is no nvidia-smi)
GPU_APPS = Fact(
    "gpu_apps",
    lambda _v: (
        "command -v nvidia-smi >/dev/null 2>&1 &&\n"
        "  nvidia-smi --query-compute-apps=pid,process_name,used_memory "
        "--format=csv,noheader 2>/dev/null\n"
        "true"
    ),
    _gpu_apps,
)


PROGRAM_NAMES = ("pdsh", "mpirun", "orted", "srun")


def _programs(text: str, rc: int) -> set[str]:
    return {ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith("have ")}


PROGRAMS = Fact(
    "programs",
    lambda _v: (
        "for p in " + " ".join(PROGRAM_NAMES) + "; do\n"
        '  command -v $p >/dev/null 2>&1 && echo "have $p"\n'
        "done\n"
        "true"
    ),
    _programs,
)
