"""How long `train --restarts` takes to get a job going again after a node is lost (issue 47):
from the moment worker-1 is made silent (blackhole routes: a power loss as the others see it)
to the first rank of the relaunched job starting (its wrapper's start record, exits.json of the
second attempt; lab nodes share this machine's clock), min / median / max over RUNS:

1. provisioned spare: the job on worker-0 and worker-1, worker-2 its spare with the stack in
   place (its provision changes nothing);
2. cold spare: the same with worker-2's venv and wheelhouse removed before each run (its
   provision installs the stack from the controller's wheelhouse).

The builtin ddp payload (8 epochs of 20 steps, 0.1 s a step) under torchrun; worker-1 silenced
once a rank there has finished an epoch. Each run heals worker-1, releases it and stops what the
first attempt left there. Usage: bench/restart_bench.py [RUNS=3]. Results:
bench/results/restart-*.json."""

import json
import shutil
import statistics
import subprocess
import sys
import time
import uuid

from lib import VENV, bench_lab, bench_lab_down, save
from nodeprep import lab
from nodeprep.ops.train import quarantine, rundir

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ARGS = ["--epochs", "8", "--steps-per-epoch", "20", "--sleep-per-step", "0.1"]


def spread(values: list[float]) -> dict:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "runs": values,
    }


def one(info, settings, env) -> float:
    before = set(rundir.runs_of(settings.runs))
    argv = [
        str(VENV / "invoke"),
        "train",
        "--inventory",
        str(info.inventory),
        "--limit",
        "worker-[0-1]",
        "--spares",
        "worker-2",
        "--restarts",
        "1",
        "--launcher",
        "torchrun",
        "--payload",
        "ddp",
        "--timeout",
        "300",
        "--",
        *ARGS,
        "--snapshot",
        f"b-{uuid.uuid4().hex[:8]}.pt",
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        new = [r for r in rundir.runs_of(settings.runs) if r not in before]
        outs = (new[-1] / "nodes" / "worker-1").glob("r*.out") if new else []
        if any("epoch 1 " in p.read_text() for p in outs):
            break
        time.sleep(0.2)
    lost = time.time()
    lab.silence_node(info, 1)
    try:
        rc = proc.wait(600)
    finally:
        lab.silence_node(info, 1, silent=False)
    new = [r for r in rundir.runs_of(settings.runs) if r not in before]
    quarantine.release(settings.state, ["*"])
    subprocess.run(
        [str(VENV / "invoke"), "train.stop", new[0].name[len(rundir.PREFIX) :]],
        env=env,
        capture_output=True,
    )
    if rc != 0 or len(new) < 2:
        raise SystemExit(f"bench: the job did not finish on its relaunch (exit {rc})")
    starts = [r["start"] for r in json.loads((new[-1] / "exits.json").read_text()).values()]
    return min(starts) - lost


def main() -> None:
    info, settings, env = bench_lab(3, name="rst")
    try:
        subprocess.run(
            [str(VENV / "invoke"), "provision", "--inventory", str(info.inventory)],
            env=env,
            check=True,
            capture_output=True,
        )
        results = {"provisioned spare": [], "cold spare": []}
        for _ in range(runs):
            results["provisioned spare"].append(one(info, settings, env))
            home = info.nodes[2].home / ".nodeprep"
            for d in ("venv", "wheelhouse"):
                shutil.rmtree(home / d, ignore_errors=True)
            results["cold spare"].append(one(info, settings, env))
        out = {k: spread(v) for k, v in results.items()}
        for k, v in out.items():
            print(
                f"{k:<18} loss -> first rank of the relaunch: min {v['min']:.1f} s, "
                f"median {v['median']:.1f} s, max {v['max']:.1f} s ({len(v['runs'])} runs)"
            )
        save("restart", [{"title": "node loss -> relaunched job's first rank", **out}])
    finally:
        bench_lab_down("rst")


if __name__ == "__main__":
    main()
