"""The Slurm transport against the ssh one (issue 18): on ONE lab with a real Slurm
(`lab.up --slurm`), interleaved rounds of
  - a no-op `invoke provision --roles ssh_keys,ssh_config,shell,nccl,deepspeed_env`, --via ssh
    (a connection from here to every node) and --via slurm (one connection, to the head, whose
    srun runs each stage as one step); every timed run is checked to change nothing;
  - `invoke verify-parity --json`: the default (past 4 nodes the probes ride the head's ssh
    logins), --via direct, and --via slurm; every timed run is checked to answer for every
    node (the lab's nodes have no venv with these roles, so the verdict itself is "drift").
Wall time is the median of RUNS (the whole process, as a user runs it); controller CPU is the
invoked process's own (getrusage of children), per node. Results: bench/results/slurm-*.json.

The lab runs every node's slurmd and sshd on this machine's cores, as it runs the
controller: the figures compare the transports' costs, not a cluster's wall times.
Usage: bench/slurm_bench.py [NODES=8] [RUNS=3]"""

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lib import ROOT, VENV, bench_lab, bench_lab_down, save

NAME = "slurmx"
ROLES = ["--roles", "ssh_keys,ssh_config,shell,nccl,deepspeed_env"]
nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 8
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def run(cmd, env, verify=None, ok=(0,)) -> tuple[float, float]:
    """(wall seconds, controller CPU seconds) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in ok:
        raise SystemExit(
            f"bench: {' '.join(cmd)} failed ({r.returncode}):\n"
            f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        )
    if verify:
        verify(r.stdout)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def noop(state: Path):
    def check(_out):
        report = json.loads((state / "runs" / "latest" / "report.json").read_text())
        if (
            report["changed"]
            or report["failed"]
            or report["unreachable"]
            or len(report["nodes"]) != nodes
        ):
            raise SystemExit(
                f"bench: provision was not a no-op on {nodes} nodes: {report['changed']}"
            )

    return check


def answered(out: str):
    got = json.loads(out)
    if got["unreachable"] or len(got["nodes"]) != nodes:
        raise SystemExit(
            f"bench: verify-parity did not answer for every node: {got['unreachable']}"
        )


def contenders(info, settings, env, tmp: Path) -> dict:
    inv = str(info.inventory)
    sets = [
        "--set",
        f"controller_key={tmp / 'id_ed25519'}",
        "--set",
        f"controller_ssh_config={tmp / 'config'}",
    ]
    prov = [str(VENV / "invoke"), "provision", "--inventory", inv, *ROLES, *sets]
    run(prov + ["--via", "ssh"], env)  # converge (untimed, may change)
    ver = [str(VENV / "invoke"), "verify-parity", "--inventory", inv, "--json"]
    return {
        "provision --via ssh": (prov + ["--via", "ssh"], noop(settings.state), (0,)),
        "provision --via slurm": (prov + ["--via", "slurm"], noop(settings.state), (0,)),
        "verify-parity (default)": (ver, answered, (0, 1)),
        "verify-parity --via direct": (ver + ["--via", "direct"], answered, (0, 1)),
        "verify-parity --via slurm": (ver + ["--via", "slurm"], answered, (0, 1)),
    }


def main() -> None:
    info, settings, env = bench_lab(nodes, name=NAME, slurm=True)
    tmp = Path(tempfile.mkdtemp(prefix="nodeprep-slurmbench-"))
    try:
        c = contenders(info, settings, env, tmp)
        for cmd, verify, ok in c.values():  # warm every contender once
            run(cmd, env, verify, ok)
        got: dict = {k: [] for k in c}
        for _ in range(runs):
            for k, (cmd, verify, ok) in c.items():
                got[k].append(run(cmd, env, verify, ok))
    finally:
        bench_lab_down(NAME)
        shutil.rmtree(tmp, ignore_errors=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in got.items()}
    cpu = {k: statistics.median(x for _, x in v) * 1000 / nodes for k, v in got.items()}
    print(f"\n{nodes} nodes, {runs} interleaved rounds, {os.cpu_count()} CPUs (medians)")
    for k in got:
        base = wall[
            "provision --via ssh" if k.startswith("provision") else "verify-parity --via direct"
        ]
        print(
            f"  {k:<28} wall {wall[k]:7.3f} s  x{wall[k] / base:5.2f}   controller CPU "
            f"{cpu[k]:6.1f} ms/node   runs: " + " ".join(f"{w:.2f}" for w, _ in got[k]),
            flush=True,
        )
    save(
        f"slurm-{nodes}",
        {
            "nodes": nodes,
            "runs": got,
            "wall": wall,
            "cpu_ms_per_node": cpu,
            "cpus": os.cpu_count(),
            "slurm": subprocess.run(
                ["srun", "--version"], capture_output=True, text=True
            ).stdout.strip(),
        },
    )


if __name__ == "__main__":
    main()
