"""How the controller's cost grows with the fleet (issue 18): for each lab size, interleaved
rounds of bare Fabric `true` (the floor), bare Fabric running the very probe `invoke facts`
sends (the floor of one probe round trip per node: on the lab the nodes' work shares the
controller's 2 cores, so it weighs in the wall time as it would not on a cluster),
`invoke facts`, a no-op `invoke provision --roles
ssh_keys,ssh_config,shell,nccl,deepspeed_env` (converged first; every timed run is checked to
change nothing) and the pyinfra deploy that manages the same files (bench/peers.py, also
checked to change nothing), optionally beside the same provision from an older checkout
(OLD=path: a git worktree; its src/ goes first on PYTHONPATH, same lab, same state).

SHAPE=shared: one home bind-mounted into every node (as NFS homes are) and EVERY role of
roles/site.yml (wheelhouse, venv, torch included): the venv and the wheels exist once, as on
such a cluster; private homes would need a torch venv per node (about 1 GB each). pyinfra is
left out there (its deploy models the five roles only).

Wall time is the median of RUNS; controller CPU is the CPU of the invoked process itself
(getrusage of children: the lab's sshd and the node-side commands are not in it), per node.
Results go to bench/results/scale-*.json; bench/scale_plot.py draws them.
--quick: no pyinfra (bench/guard.py's mode: the figures it keeps are ratios to the floors).
Usage: bench/scale_bench.py [SIZES=8,32] [RUNS=3] [--quick] (env OLD=/path/to/old/checkout,
SHAPE=shared)"""

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

import yaml

import peers
from lib import ROOT, VENV, bench_lab, bench_lab_down, save
from nodeprep.engine import facts as factmod  # noqa: E402  (lib puts src/ on the path)

SHARED = os.environ.get("SHAPE") == "shared"
ROLES = [] if SHARED else ["--roles", "ssh_keys,ssh_config,shell,nccl,deepspeed_env"]
QUICK = "--quick" in sys.argv
_args = [a for a in sys.argv[1:] if not a.startswith("--")]
sizes = [int(x) for x in (_args[0] if _args else "8,32").split(",")]
runs = int(_args[1]) if len(_args) > 1 else 3
old = os.environ.get("OLD")


def nodeprep_noop(state, n_nodes: int):
    """The run's report.json (runs/latest): every node and controller step ok, nothing changed."""

    def check(_output):
        report = json.loads((state / "runs" / "latest" / "report.json").read_text())
        bad = {
            k: [f"{s['step']} ({s['message']})" for s in r["steps"] if s["status"] != "ok"]
            or [r["status"]]
            for k, r in report["nodes"].items()
            if r["status"] != "ok" or r["changed"]
        }
        ctl = [c for c in report["controller"] if c["status"] != "ok"]
        if report["changed"] or bad or ctl or len(report["nodes"]) != n_nodes:
            first = dict(list(bad.items())[:3])
            raise SystemExit(
                f"bench: nodeprep run was not a no-op on {len(bad)} node(s), e.g. {first}"
                f"{'; controller: ' + str(ctl) if ctl else ''}"
            )

    return check


def run(cmd, env, verify=None) -> tuple[float, float]:
    """(wall seconds, controller CPU seconds) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(
            f"bench: {' '.join(cmd)} failed ({r.returncode}):\n"
            f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        )
    if verify:
        verify(r.stdout + r.stderr)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def contenders_for(info, settings, env, tmp: Path) -> dict:
    """{name: (argv, env, verify)}; nodeprep converged first (and, without SHAPE=shared, the
    pyinfra deploy written from what it left on the nodes)."""
    inv, n = str(info.inventory), len(info.nodes)
    key, config = tmp / "id_ed25519", tmp / "config"
    sets = ["--set", f"controller_key={key}", "--set", f"controller_ssh_config={config}"]
    provision = [str(VENV / "invoke"), "provision", "--inventory", inv, *ROLES, *sets]
    run(provision, env)  # converge (untimed, may change)
    probe = tmp / "facts_probe.sh"  # what `invoke facts` runs on each node, token and all
    # with the inventory's vars, as `invoke facts` sends it: without them the python fact asks
    # for `python3` (the venv's, first on PATH in a provisioned shared home) where facts and
    # provision ask for the inventory's /usr/bin/python3, and the two evicted each other's
    # entry of the node's one-entry python cache on every round (a python start per node each)
    host_vars = (yaml.safe_load(Path(inv).read_text()) or {}).get("vars") or {}
    probe.write_text(factmod.probe_script(factmod.NODE_FACTS, host_vars, "0123456789ab"))
    out = {
        "bare Fabric true": ([str(VENV / "python"), "bench/bare_fabric.py", inv], env, None),
        "bare Fabric probe": (
            [str(VENV / "python"), "bench/bare_fabric.py", inv, str(probe)],
            env,
            None,
        ),
        "invoke facts": ([str(VENV / "invoke"), "facts", "--inventory", inv], env, None),
        "no-op provision": (provision, env, nodeprep_noop(settings.state, n)),
    }
    if not SHARED and not QUICK:
        peers.prepare_out()
        end = peers.end_state(info, config)
        pinv, deploy = peers.write_pyinfra(
            info, settings.known_hosts, end, [key, settings.state / "cluster_key" / "id_ed25519"]
        )
        pyinfra = [str(peers.venv("pyinfra") / "pyinfra"), "-y", str(pinv), str(deploy)]
        run(pyinfra, env)  # converge the peer too
        out[f"pyinfra {peers.version('pyinfra')} deploy"] = (
            pyinfra,
            env,
            peers.pyinfra_noop(n + 1),
        )
    if old:
        out["no-op provision (OLD)"] = (
            [str(VENV / "invoke"), "-r", old, *provision[1:]],
            dict(env, PYTHONPATH=f"{old}/src"),
            nodeprep_noop(settings.state, n),
        )
    return out


def one_size(n: int) -> dict:
    info, settings, env = bench_lab(n, name="scale", shared_home=SHARED)
    tmp = Path(tempfile.mkdtemp(prefix="nodeprep-scale-"))
    try:
        contenders = contenders_for(info, settings, env, tmp)
        for cmd, e, verify in contenders.values():  # warm every contender once
            run(cmd, e, verify)
        got: dict = {k: [] for k in contenders}
        for _ in range(runs):
            for k, (cmd, e, verify) in contenders.items():
                got[k].append(run(cmd, e, verify))
    finally:
        bench_lab_down("scale")
        shutil.rmtree(tmp, ignore_errors=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in got.items()}
    cpu = {k: statistics.median(c for _, c in v) * 1000 / n for k, v in got.items()}
    print(
        f"\n{n} nodes{' (one shared home, all roles)' if SHARED else ''}, "
        f"{runs} interleaved rounds, "
        f"{os.cpu_count()} CPUs (medians)",
        flush=True,
    )
    for k in got:
        print(
            f"  {k:<24} wall {wall[k]:7.3f} s  "
            f"x{wall[k] / wall['bare Fabric true']:5.2f} vs bare Fabric   "
            f"controller CPU {cpu[k]:6.1f} ms/node   runs: "
            + " ".join(f"{w:.2f}" for w, _ in got[k]),
            flush=True,
        )
    return {
        "nodes": n,
        "shape": "shared" if SHARED else "private",
        "runs": got,
        "wall": wall,
        "cpu_ms_per_node": cpu,
    }


results = [one_size(n) for n in sizes]
kind = ("quick-" if QUICK else "") + ("shared-" if SHARED else "")  # plot: scale-[0-9]*
save(f"scale-{kind}{'-'.join(map(str, sizes))}", results)
