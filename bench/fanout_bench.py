"""Cold wheel fan-out (issue 18, part 2): does the controller send each wheel about once, and
does the fan-out to N nodes take about the time of one send?

A lab "fan" of NODES nodes, each node's link limited both ways to RATE (tc on its veth; the
bridge and the controller unlimited). A cold run is `invoke provision --roles
ssh_keys,ssh_config,wheelhouse` after each target node's wheelhouse and mesh known_hosts were
removed (so the mesh is applied in the first pass and the wheels relayed in the second, as
on a first provision). Measured, medians of RUNS:
  (a) one:    the same cold run limited to worker-0: the wheelhouse sent once over one link
  (b) fanout: the cold run on every node
  (c) bytes the controller sent during (b): the lab bridge's own tx counter (every byte the
      controller put on the wire to any node, ssh and probes included; node-to-node traffic
      is forwarded by the bridge, never sent by the bridge's own interface), and the payload
      the run report counts (controller_bytes), each divided by the wheelhouse's size
  (d) direct (DIRECT=1): (b) with wheelhouse_relay=false, every node pushed by the controller
Every run is checked: each node got every wheel (from whom, no fallback), nothing failed.
Targets: (b)/(a) <= 3 and (c) <= 2 wheelhouse sizes.

PAYLOAD=stack (default) is the real CPU stack of requirements/node.txt + torch (~228 MB);
PAYLOAD=<MB> is that many MB of made wheels (10 files), for quick runs.

CPU: this machine has 2 cores, and the lab's nodes share them. In a chain every node
decrypts what it receives and encrypts what it passes on (ssh; AES-128-GCM and ChaCha20 both
~5 GB/s a core here, `openssl speed`), tees and untars it, and the controller's arrival check
hashes each node's copy once (openssl's sha256, ~1.7 GB/s a core with SHA-NI; coreutils'
sha256sum, the fallback, ~0.55 GB/s). At 32 nodes x 200 Mbit/s
(25 MB/s a link, 800 MB/s in all while the chain streams) the crypto is ~1.6 GB/s of work, a
third of a core; with the copies through pipes, the kernel's side of 64 ssh connections and
tc, the machine is well loaded but the links stay the bottleneck. The sha256 checks are not
streamed: 32 x 228 MB = 7.3 GB is ~2-3 s of both cores after the stream ends, CPU time a real
cluster spreads over 32 machines; it is the part of (b) that grows with N here. So the bench
prints the mean number of OTHER running processes, the controller's CPU and how busy the
whole machine was during each run (both cores, every process: near 100% means CPU-bound). If
(b) is CPU-bound, rerun with RATE=100mbit (the link then takes 18 s for 228 MB and the CPU
work per second halves) and say so; a real cluster's nodes have their own cores.
Results: bench/results/fanout-*.json.
Usage: bench/fanout_bench.py [NODES=32] [RUNS=3]   (env RATE=200mbit PAYLOAD=stack DIRECT=1)
"""

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from lib import ROOT, VENV, Foreign, bench_lab, bench_lab_down, save

NAME = "fan"
nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 32
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
rate = os.environ.get("RATE", "200mbit")
payload = os.environ.get("PAYLOAD", "stack")
direct = os.environ.get("DIRECT") == "1"
STATE = ROOT / ".nodeprep" / f"bench-{NAME}"


def made_wheels(total_mb: int) -> list[str]:
    """--set values for a payload of TOTAL_MB made wheels (cached), pip resolving from them."""
    d = STATE / f"wheels-{total_mb}"
    if not d.exists():
        tmp = STATE / f".wheels-{total_mb}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for i in range(10):
            name = f"npbench{i}"
            with zipfile.ZipFile(
                tmp / f"{name}-1.0-py3-none-any.whl", "w", zipfile.ZIP_STORED
            ) as z:
                z.writestr(f"{name}/data.bin", os.urandom(total_mb * 100_000))
                z.writestr(
                    f"{name}-1.0.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
                )
                z.writestr(
                    f"{name}-1.0.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: bench\n"
                    "Root-Is-Purelib: true\nTag: py3-none-any\n",
                )
                z.writestr(f"{name}-1.0.dist-info/RECORD", "")
        (tmp / "req.txt").write_text("".join(f"npbench{i}==1.0\n" for i in range(10)))
        tmp.rename(d)
    os.environ.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(d))
    return [f"python_requirements=[{d / 'req.txt'}]", "wheel_builds={}", "torch_version="]


def command(info, sets: list[str], limit: str | None) -> list[str]:
    cmd = [
        str(VENV / "invoke"),
        "provision",
        "--inventory",
        str(info.inventory),
        "--json",
        "--roles",
        "ssh_keys,ssh_config,wheelhouse",
    ]
    for s in sets + [f"controller_key={STATE}/ctl/id", f"controller_ssh_config={STATE}/ctl/config"]:
        cmd += ["--set", s]
    return cmd + (["--limit", limit] if limit else [])


def make_cold(info, which: list[int]) -> None:
    """The wheelhouse and the mesh's known_hosts gone from these nodes (their lab key stays)."""
    for i in which:
        home = info.nodes[i].home
        shutil.rmtree(home / ".nodeprep" / "wheelhouse", ignore_errors=True)
        (home / ".ssh" / "known_hosts").unlink(missing_ok=True)


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine (every process: the nodes' sshd, ssh, tar)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)


def bridge_tx() -> int:
    return int(Path(f"/sys/class/net/np-{NAME}/statistics/tx_bytes").read_text())


def one_run(info, env, sets, which: list[int], relay: bool) -> dict:
    make_cold(info, which)
    # The lab's nodes share this machine's one disk: a run writes N x the wheelhouse (7.3 GB
    # at 32 nodes), and its writeback must not go on into the next run's timing. Flushed
    # before every run, of every kind, outside the timing.
    os.sync()
    limit = "worker-0" if which == [0] else None
    cmd = command(info, sets + ([] if relay else ["wheelhouse_relay=false"]), limit)
    before, tx, ticks = resource.getrusage(resource.RUSAGE_CHILDREN), bridge_tx(), cpu_ticks()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    sent, after = bridge_tx() - tx, resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = (cpu_ticks()[0] - ticks[0]) / max(1, cpu_ticks()[1] - ticks[1])
    if r.returncode:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    rep = json.loads(r.stdout[r.stdout.index("{\n") :])
    w = {n: x.get("wheelhouse") for n, x in rep["nodes"].items()}
    bad = {n: x for n, x in w.items() if relay and (not x or x["fallback"] or x["relay_error"])}
    if rep["failed"] or len(w) != len(which) or bad:
        raise SystemExit(f"bench: the run did not relay cleanly: {bad or rep['failed']}")
    return {
        "wall": wall,
        "bridge_tx": sent,
        "controller_bytes": sum((x or {}).get("controller_bytes", 0) for x in w.values()),
        "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "machine_busy": busy,
    }


def size_of_wheelhouse(info) -> int:
    d = info.nodes[0].home / ".nodeprep" / "wheelhouse"
    return sum(p.stat().st_size for p in d.glob("*.whl"))


def main():
    info, _settings, env = bench_lab(nodes, name=NAME, link_rate=rate)
    sets = made_wheels(int(payload)) if payload != "stack" else []
    env = dict(
        env, **{k: os.environ[k] for k in ("PIP_NO_INDEX", "PIP_FIND_LINKS") if k in os.environ}
    )
    try:
        one_run(info, env, sets, list(range(nodes)), True)  # warm: wheels resolved, mesh made
        size = size_of_wheelhouse(info)
        kinds = {"one": ([0], True), "fanout": (list(range(nodes)), True)}
        if direct:
            kinds["direct"] = (list(range(nodes)), False)
        got: dict[str, list[dict]] = {k: [] for k in kinds}
        with Foreign() as foreign:
            for _ in range(runs):
                for k, (which, relay) in kinds.items():
                    got[k].append(one_run(info, env, sets, which, relay))
        med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in got.items()}
        print(
            f"\ncold wheel fan-out: {nodes} nodes, links {rate}, wheelhouse {size / 1e6:.1f} MB "
            f"({payload}), medians of {runs}; other running processes: {foreign.mean:.2f}"
        )
        for k, m in med.items():
            print(
                f"  {k:<7} wall {m['wall']:7.2f} s  "
                f"x{m['wall'] / med['one']['wall']:5.2f} vs one   "
                f"controller sent {m['bridge_tx'] / size:5.2f} wheelhouses on the wire, "
                f"{m['controller_bytes'] / size:5.2f} payload   controller CPU {m['cpu']:.1f} s   "
                f"machine busy {m['machine_busy']:4.0%}"
            )
        ok = (
            med["fanout"]["wall"] <= 3 * med["one"]["wall"]
            and med["fanout"]["bridge_tx"] <= 2 * size
        )
        print(
            "  targets (fan-out <= 3x one send, controller <= 2 wheelhouses): "
            f"{'met' if ok else 'NOT met'}"
        )
        save(
            "fanout",
            [
                {
                    "nodes": nodes,
                    "rate": rate,
                    "payload": payload,
                    "wheelhouse_bytes": size,
                    "runs": got,
                    "medians": med,
                    "foreign_running": foreign.mean,
                    "targets_met": ok,
                }
            ],
        )
    finally:
        bench_lab_down(NAME)


if __name__ == "__main__":
    main()
