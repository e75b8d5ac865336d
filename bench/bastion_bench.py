"""A no-op `invoke provision` of N lab nodes behind one bastion against the same nodes reached
directly (issue 30: at most 1.3x at 64 nodes; controller CPU per node flat; bastion logins per
run: 1). One lab with a bastion (lab.up --bastion); for the direct contender the nodes' sshds
take the controller again (the lab's wall lifted, lab/bastion.py wall_off) and the inventory
has no proxy_jump; interleaved rounds, order reversed every other round, medians of RUNS.
The roles need no package index (the engine's path is the subject): ssh_keys, shell, nccl,
deepspeed_env; both inventories are provisioned once before timing (untimed), so every timed
run must report nothing to change. Controller CPU: the child's user+system time.
Usage: bench/bastion_bench.py [NODES=64] [RUNS=5]"""

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lib import VENV, bench_lab, bench_lab_down, save
from nodeprep.lab import bastion as labbastion

nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 64
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
ROLES = "ssh_keys,shell,nccl,deepspeed_env"


def run(inv: str, env: dict, tmp: Path) -> tuple[float, float, dict]:
    cmd = [
        str(VENV / "invoke"),
        "provision",
        "--inventory",
        inv,
        "--roles",
        ROLES,
        "--json",
        "--set",
        f"controller_key={tmp / 'id'}",
        "--set",
        f"controller_ssh_config={tmp / 'config'}",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r.returncode:
        raise SystemExit(f"bench: provision failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return wall, cpu, json.loads(r.stdout)


def logins(info) -> int:
    return (info.bastion.home.parent / "sshd.log").read_text().count("Accepted publickey")


def wall(info, on: bool) -> None:
    labbastion.wall_off(info.nodes, int(info.nodes[0].address.split(".")[1]), on)
    time.sleep(1.0)  # the sshds re-exec on SIGHUP


info, settings, env = bench_lab(nodes, bastion=True)
tmp = Path(settings.state_dir) / "bastion-bench"
tmp.mkdir(parents=True, exist_ok=True)
via = str(info.inventory)
direct = tmp / "direct.yml"
direct.write_text(
    "".join(ln for ln in info.inventory.read_text().splitlines(True) if "proxy_jump" not in ln)
)
results = []
try:
    wall(info, False)
    run(str(direct), env, tmp)  # untimed: the cold provision
    wall(info, True)
    run(via, env, tmp)
    times = {"direct": [], "bastion": []}
    cpu = {"direct": [], "bastion": []}
    per_run_logins = []
    for i in range(runs):
        order = ["direct", "bastion"] if i % 2 == 0 else ["bastion", "direct"]
        for k in order:
            wall(info, k == "bastion")
            n0 = logins(info)
            w, c, rep = run(via if k == "bastion" else str(direct), env, tmp)
            if rep["changed"] or rep["failed"] or rep["unreachable"]:
                raise SystemExit(f"bench: the {k} run was no no-op: {json.dumps(rep)[:1500]}")
            times[k].append(w)
            cpu[k].append(c)
            if k == "bastion":
                per_run_logins.append(logins(info) - n0)
        print(
            f"round {i + 1}: direct {times['direct'][-1]:.2f} s, "
            f"bastion {times['bastion'][-1]:.2f} s",
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu_node = {k: statistics.median(v) / nodes * 1000 for k, v in cpu.items()}
    ratio = med["bastion"] / med["direct"]
    print(
        f"no-op provision of {nodes} nodes: direct {med['direct']:.2f} s, behind one bastion "
        f"{med['bastion']:.2f} s: x{ratio:.2f} "
        f"(target <= 1.3x: {'met' if ratio <= 1.3 else 'NOT met'}); "
        f"controller CPU per node {cpu_node['direct']:.1f} ms direct, "
        f"{cpu_node['bastion']:.1f} ms via the "
        f"bastion; bastion logins per run {per_run_logins}"
    )
    results.append(
        {
            "nodes": nodes,
            "runs": times,
            "cpu": cpu,
            "medians": med,
            "ratio": ratio,
            "cpu_ms_per_node": cpu_node,
            "bastion_logins": per_run_logins,
        }
    )
finally:
    bench_lab_down()
save(f"bastion-{nodes}", results)
