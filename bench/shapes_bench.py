"""Cold `invoke provision` of 8 nodes on ONE shared home against 8 private homes, side by side.

On a shared home (NFS in real clusters; one bind-mounted directory in the lab) one node acts
for the home: the venv is made and the wheelhouse pushed once, the other nodes only verify.
Target (issue 13): the shared-home run takes at most 0.5x the wall time of the private-homes
run and pushes the wheelhouse once. Each round wipes the nodes' venv and wheelhouse (the
controller's own wheelhouse stays cached, the same for both), switches the lab's home shape
(lab.down + lab.up, not timed) and times the whole `invoke provision` process.

Usage: .venv/bin/python bench/shapes_bench.py [ROUNDS]   (default 3; ~1.5 min a round here)
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time

from lib import ROOT, VENV, bench_settings, save
from nodeprep import lab

NAME, NODES = "bshape", 8
STATE = ROOT / ".nodeprep" / f"bench-{NAME}"


def up(shared: bool):
    settings = bench_settings(STATE)
    lab.down(NAME, settings, log=lambda *a: None)
    info = lab.up(
        NODES,
        NAME,
        settings,
        lab.UpOptions(inventory_dir=STATE / "inventory", shared_home=shared),
        log=lambda *a: None,
    )
    for node in info.nodes:  # cold: no venv, no wheelhouse on the nodes
        for d in ("venv", "wheelhouse"):
            shutil.rmtree(node.home / ".nodeprep" / d, ignore_errors=True)
    return info


def cold(shared: bool) -> tuple[float, int, int]:
    """(seconds, wheelhouse pushes, venv installs) of one cold provision."""
    info = up(shared)
    env = {"INVOKE_NODEPREP_STATE_DIR": str(STATE), "PATH": "/usr/bin:/bin"}
    cmd = [str(VENV / "invoke"), "provision", "--inventory", str(info.inventory), "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(
            f"bench: provision ({'shared' if shared else 'private'}) failed: {r.stdout[-2000:]}"
        )
    rep = json.loads(r.stdout)
    steps = [s for n in rep["nodes"].values() for s in n["steps"] if s["status"] == "changed"]
    pushes = sum(s["step"].startswith("wheelhouse: wheelhouse.sync") for s in steps)
    installs = sum(s["step"].startswith("venv: pip.install") for s in steps)
    return dt, pushes, installs


def main(n: int) -> None:
    runs: dict[str, list] = {"private homes": [], "shared home": []}
    try:
        for _ in range(n):
            for key, shared in (("private homes", False), ("shared home", True)):
                runs[key].append(cold(shared))
                print(
                    f"  {key:<14} {runs[key][-1][0]:6.1f} s  wheelhouse pushes {runs[key][-1][1]}  "
                    f"venv installs {runs[key][-1][2]}",
                    flush=True,
                )
    finally:
        lab.down(NAME, bench_settings(STATE), log=lambda *a: None)
    med = {k: statistics.median(t for t, _p, _i in v) for k, v in runs.items()}
    ratio = med["shared home"] / med["private homes"]
    print(
        f"\ncold provision, {NODES} nodes, medians of {n}: "
        f"private homes {med['private homes']:.1f} s, "
        f"shared home {med['shared home']:.1f} s = x{ratio:.2f} (target <= 0.5: "
        f"{'MET' if ratio <= 0.5 else 'NOT MET'}); wheelhouse pushed "
        f"{runs['shared home'][0][1]}x on the shared home, "
        f"{runs['private homes'][0][1]}x on private homes"
    )
    save(
        "shapes",
        [
            {
                "title": "cold provision 8 nodes: shared vs private homes",
                "medians": med,
                "runs": {k: [list(x) for x in v] for k, v in runs.items()},
                "ratio": ratio,
            }
        ],
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
