"""A job's project synced to the lab's nodes (issue 48): nodeprep's sync as `train --payload`
runs it (the files as git sees them; homes that would get the same fed one stream chained node
to node over the mesh, ops/sync/chained.py; then each node's own sync, ops/sync/push.py, which
sends what a chain did not bring)
against `rsync -a` given the same file list (`--files-from`), run once per node, all nodes at
once. The project: a git repository of 20,000 small files, two 16 MB files and an ignored
8 MB checkpoint directory (what git would not track is in neither list).

Timed, medians over ROUNDS interleaved rounds (one warm-up each first):
- first sync: every node's copy removed before the run (the node's page cache stays warm);
- no-change sync: the same again with nothing changed.
Both contenders connect afresh each run (nodeprep: a Fleet's connections; rsync: its ssh).
Usage: bench/sync_bench.py [NODES=8] [ROUNDS=3]. Results: bench/results/sync-*.json.
Targets (issue 48): first sync <= 1.2x rsync, no-change sync <= 0.5x."""

import os
import subprocess
import sys
import time
from pathlib import Path

from lib import ROOT, bench_lab, bench_lab_down, mesh, rsync_all, save, summary
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.inventory import model as inventory
from nodeprep.ops.sync import chained, fileset, push

NODES = int(sys.argv[1]) if len(sys.argv) > 1 else 8
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
NAME, SUBNET = "syb", 174
DEST = "/home/nodeprep/sync-bench"
GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@b",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@b",
}


def project(root: Path) -> Path:
    if (root / ".git").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    (root / ".gitignore").write_text("checkpoints/\n*.log\n")
    for i in range(20_000):
        d = root / "pkg" / f"m{i // 500:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.py").write_text(f"X = {i}\n")
    for name in ("tokenizer.bin", "weights.bin"):
        (root / name).write_bytes(os.urandom(16 << 20))
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "step-1.pt").write_bytes(os.urandom(8 << 20))
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "bench"]):
        subprocess.run(["git", *args], cwd=root, env=GIT_ENV, check=True)
    return root


def nodeprep_sync(info, settings, files) -> float:
    inv = inventory.load(str(info.inventory))
    t0 = time.perf_counter()
    how = push.How()  # one for the sync: its nodes share the hashes and the tar stream
    dest = DEST + "/np"
    with Fleet(inv.hosts[:NODES], settings, "sync-bench", Events()) as fleet:
        try:
            fanned = chained.fan_out(fleet, list(fleet.sessions), files, lambda n: dest, how)
            fleet.map(lambda s: push.push(s, files, dest, how, fanned.look(s.name)), "sync")
        finally:
            how.close()
        bad = fleet.unusable()
    took = time.perf_counter() - t0
    if bad:
        raise SystemExit(f"bench: nodeprep's sync failed: {bad}")
    return took


def rsync_sync(info, settings, root: Path, listing: Path) -> float:
    args = ["--files-from", str(listing), f"{root}/"]
    return rsync_all(info, settings, NODES, args, f"{DEST}/rs/")


def wipe(info, which: str) -> None:
    for i in range(NODES):
        info.nodes[i].home.joinpath("sync-bench", which).exists() and subprocess.run(
            ["rm", "-rf", str(info.nodes[i].home / "sync-bench" / which)], check=True
        )


def main() -> None:
    root = project(ROOT / ".nodeprep" / "bench-sync-project")
    names = fileset.of(root).files
    files = {rel: root / rel for rel in names}
    listing = ROOT / ".nodeprep" / "bench-sync-files.txt"
    listing.write_text("\n".join(names) + "\n")
    info, settings, _env = bench_lab(NODES, name=NAME, subnet=SUBNET)
    try:
        mesh(info, settings)
        times = {
            "first": {"nodeprep": [], "rsync -a": []},
            "again": {"nodeprep": [], "rsync -a": []},
        }
        for r in range(ROUNDS + 1):  # round 0 warms both up
            wipe(info, "np")
            first_np = nodeprep_sync(info, settings, files)
            again_np = nodeprep_sync(info, settings, files)
            wipe(info, "rs")
            first_rs = rsync_sync(info, settings, root, listing)
            again_rs = rsync_sync(info, settings, root, listing)
            if r:
                times["first"]["nodeprep"].append(first_np)
                times["first"]["rsync -a"].append(first_rs)
                times["again"]["nodeprep"].append(again_np)
                times["again"]["rsync -a"].append(again_rs)
        out = [
            summary(f"first sync, {len(names)} files to {NODES} nodes", times["first"], "rsync -a"),
            summary("no-change sync", times["again"], "rsync -a"),
        ]
        save("sync", out)
    finally:
        bench_lab_down(NAME)


if __name__ == "__main__":
    main()
