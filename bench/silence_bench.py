"""How long a silent node takes to be named (issue 36), on the lab, whole commands or the
engine as a command runs it; a node is made silent with blackhole routes in its network
namespace (lab.silence_node: no RST, no answer, as a power loss looks from outside):

1. at connect: `invoke facts` on a 2-node lab with worker-1 silent from the start, the time
   to its end (worker-0 answers in well under a second: the end is when worker-1 is named);
2. mid-command: one node runs `sleep 60`, is silenced 1 s in, and the time from the silence
   to the engine's Unreachable ('silent for 15 s ...') is taken;
3. a no-op `invoke provision --roles ssh_keys,ssh_config,shell,nccl,deepspeed_env` of N nodes
   (64 by default) with one silent node against none (interleaved, medians).

(1) and (2): min / median / max over RUNS (20 by default). Defaults: connect_timeout 10 s,
silent_after 15 s. Usage: bench/silence_bench.py [RUNS=20] [NODES=64] [NOOP_RUNS=3]
(NODES=0 skips 3). Results: bench/results/silence-*.json."""

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lib import ROOT, VENV, bench_lab, bench_lab_down, save, timed
from nodeprep import lab
from nodeprep.engine.connect_errors import Unreachable
from nodeprep.engine.fleet import Fleet
from nodeprep.inventory import load

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 64
noop_runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3


def spread(values: list[float]) -> dict:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "runs": len(values),
    }


def at_connect(info, env) -> list[float]:
    out = []
    lab.silence_node(info, 1)
    try:
        for _ in range(runs):
            out.append(
                timed(
                    [str(VENV / "invoke"), "facts", "--inventory", str(info.inventory)],
                    env=env,
                    check=False,
                )
            )
    finally:
        lab.silence_node(info, 1, silent=False)
    return out


def mid_command(info, settings) -> list[float]:
    hosts = [h for h in load(str(info.inventory)).hosts if h.name == "worker-1"]
    out = []
    for _ in range(runs):
        with Fleet(hosts, settings, "silence-bench") as fleet:
            s = fleet.sessions["worker-1"]
            s.connect()
            threading.Timer(1.0, lab.silence_node, (info, 1)).start()
            t0 = time.monotonic()
            try:
                s.run("sleep 60", timeout=120, label="sleep 60")
                raise SystemExit("bench: the silent node's command returned")
            except Unreachable:
                out.append(time.monotonic() - t0 - 1.0)
            finally:
                lab.silence_node(info, 1, silent=False)
    return out


def noop_provision(tmp: Path) -> dict:
    info, settings, env = bench_lab(nodes, name="silb")
    try:
        sets = ["--set", f"controller_key={tmp}/id", "--set", f"controller_ssh_config={tmp}/config"]
        cmd = [
            str(VENV / "invoke"),
            "provision",
            "--inventory",
            str(info.inventory),
            "--roles",
            "ssh_keys,ssh_config,shell,nccl,deepspeed_env",
            *sets,
        ]
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True)  # converge
        times = {"none silent": [], "one silent": []}
        for _ in range(noop_runs):
            times["none silent"].append(timed(cmd, env=env))
            lab.silence_node(info, nodes - 1)
            try:
                times["one silent"].append(timed(cmd, env=env, check=False))
            finally:
                lab.silence_node(info, nodes - 1, silent=False)
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        bench_lab_down("silb")


def main() -> None:
    info, settings, env = bench_lab(2, name="sil")
    try:
        out = {
            "at_connect": spread(at_connect(info, env)),
            "mid_command": spread(mid_command(info, settings)),
        }
    finally:
        bench_lab_down("sil")
    for k in ("at_connect", "mid_command"):
        s = out[k]
        print(
            f"{k}: min {s['min']:.1f} s, median {s['median']:.1f} s, "
            f"max {s['max']:.1f} s ({s['runs']} runs)"
        )
    if nodes:
        with tempfile.TemporaryDirectory() as d:
            out["noop_provision"] = n = noop_provision(Path(d))
        out["nodes"] = nodes
        print(
            f"no-op provision of {nodes} nodes (medians of {noop_runs}): "
            f"none silent {n['none silent']:.2f} s, "
            f"one silent {n['one silent']:.2f} s (+{n['one silent'] - n['none silent']:.1f} s)"
        )
    save("silence", out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
