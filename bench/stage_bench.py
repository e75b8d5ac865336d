"""A dataset staged to the lab's nodes at a limited link rate (issue 48): `invoke stage` (one
stream chained node to node, ops/stage/) against the controller sending to each node itself
(`rsync -a` of the same directory, one per node, all at once: what a user's own loop does).

Every node's link is limited to RATE (the lab's --link-rate: a node's egress and its ingress),
and so is the controller's: a token bucket on the lab bridge's own egress, which carries what
the host sends into the bridge and not what nodes send each other. The controller is one more
machine on the same network, as on a real cluster, and its one link is what a fan-out from it
shares.

Timed, medians over ROUNDS interleaved rounds (every node's copy removed before each run):
Usage: bench/stage_bench.py [NODES=8] [ROUNDS=3] [GB=2] [RATE=400mbit].
Results: bench/results/stage-*.json. Target (issue 48): <= 0.4x the controller to each."""

import subprocess
import sys
import time
from pathlib import Path

from lib import ROOT, bench_lab, bench_lab_down, mesh, rsync_all, save, summary
from nodeprep.commands import stage as stage_cmd
from nodeprep.commands.options import StageOptions
from nodeprep.engine.events import Events
from nodeprep.lab import config as labconfig
from nodeprep.lab import net as labnet

NODES = int(sys.argv[1]) if len(sys.argv) > 1 else 8
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
GB = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
RATE = sys.argv[4] if len(sys.argv) > 4 else "400mbit"
NAME, SUBNET = "stb", 176
DEST = "stage-bench"


def dataset(root: Path) -> Path:
    """GB of random bytes in 8 files (kept between runs of the bench)."""
    root.mkdir(parents=True, exist_ok=True)
    size = int(GB * (1 << 30)) // 8
    for i in range(8):
        f = root / f"part-{i}.bin"
        if not f.exists() or f.stat().st_size != size:
            with open(f, "wb") as out:
                subprocess.run(["head", "-c", str(size), "/dev/urandom"], stdout=out, check=True)
    return root


def nodeprep_stage(info, settings, src: Path) -> float:
    opts = StageOptions(inventory=str(info.inventory), src=str(src), dest=f"~/{DEST}/np")
    t0 = time.perf_counter()
    res = stage_cmd.stage(opts, settings, Events()).stages[0]
    took = time.perf_counter() - t0
    if not res.ok or res.sent_here > src_bytes(src) * 1.01:
        raise SystemExit(f"bench: the stage failed or sent more than one copy: {res.as_dict()}")
    return took


def src_bytes(src: Path) -> int:
    return sum(p.stat().st_size for p in src.iterdir())


def rsync_each(info, settings, src: Path) -> float:
    return rsync_all(info, settings, NODES, [f"{src}/"], f"/home/{info.user}/{DEST}/rs/")


def wipe(info) -> None:
    for node in info.nodes[:NODES]:
        subprocess.run(["rm", "-rf", str(node.home / DEST)], check=True)


def main() -> None:
    src = dataset(ROOT / ".nodeprep" / f"bench-stage-{GB:g}g")
    info, settings, _env = bench_lab(NODES, name=NAME, subnet=SUBNET, link_rate=RATE)
    try:
        labnet.tc_batch({None: labconfig.tc_lines(labconfig.bridge_name(NAME), RATE)})
        mesh(info, settings)
        times = {"nodeprep stage": [], "controller to each (rsync -a)": []}
        for _ in range(ROUNDS):
            wipe(info)
            times["nodeprep stage"].append(nodeprep_stage(info, settings, src))
            wipe(info)
            times["controller to each (rsync -a)"].append(rsync_each(info, settings, src))
            print({k: round(v[-1], 1) for k, v in times.items()}, flush=True)
        title = f"staging {GB:g} GiB to {NODES} nodes, every link {RATE}"
        save("stage", [summary(title, times, "controller to each (rsync -a)")])
    finally:
        bench_lab_down(NAME)


if __name__ == "__main__":
    main()
