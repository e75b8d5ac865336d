"""Cold provision of N aarch64 lab nodes (lab.up --arch aarch64: arm64 userlands under qemu-user)
from this x86_64 controller, against the same work typed by hand under the same emulation: in
parallel per node, `scp -r` of the controller's aarch64 wheelhouse, `python3 -m venv` + `pip
install --no-index --no-compile` of its lock (the flags nodeprep uses), `import torch`. A
second floor is the naive hand install (pip's default byte-compiling), which nodeprep beats.
The controller's cache (the aarch64 wheelhouse download, the deepspeed build) is warmed first
and left out of the timed part. nodeprep's run is the whole provision (every role: ssh mesh,
ssh config, shell, nccl, wheelhouse, venv, torch verify, deepspeed_env), split per phase;
the hand floor does only the Python stack, so the ratio is conservative.
Target (issue 32): nodeprep at most 1.1x the floor.
Usage: bench/aarch64_bench.py [NODES=2] [RUNS=3]"""

import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lib import VENV, Foreign, bench_lab, bench_lab_down, save, summary

TARGET = 1.10
TORCH = "2.8.0+cpu"
NAME = "barm"
nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 2
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def log(msg):
    print(msg, flush=True)


import pystack_bench as pystack  # noqa: E402  (its parts; its main() runs only as a script)


def provision_cmd(info, tmp):
    return [
        str(VENV / "invoke"),
        "provision",
        "--inventory",
        str(info.inventory),
        "--set",
        f"controller_key={tmp / 'id_ed25519'}",
        "--set",
        f"controller_ssh_config={tmp / 'config'}",
    ]


def wipe(info):
    """A cold node: no venv, wheelhouse or managed ssh files (the mesh is made again)."""
    pystack.wipe(info, len(info.nodes))
    for node in info.nodes:
        for f in ("nodeprep_cluster_ed25519", "nodeprep_cluster_ed25519.pub", "config"):
            (node.home / ".ssh" / f).unlink(missing_ok=True)
        (node.home / ".deepspeed_env").unlink(missing_ok=True)


def by_hand(info, settings, house: Path, compile_: bool):
    opts = pystack.ssh_opts(settings, info)
    lock = "\n".join(json.loads((house / "MANIFEST.json").read_text())["lock"]) + "\n"
    flags = "" if compile_ else " --no-compile"
    t0 = time.perf_counter()

    def one(node):
        dest, ph, t = f"{info.user}@{node.address}", {}, time.perf_counter()
        pystack.sh(["scp", "-q", "-r", *opts, str(house), f"{dest}:.nodeprep/wheelhouse"])
        ph["scp"], t = time.perf_counter() - t, time.perf_counter()
        pystack.sh(
            [
                "ssh",
                *opts,
                dest,
                "cat > ~/.nodeprep/wheelhouse/requirements.lock && "
                f"python3 -m venv ~/.nodeprep/venv && ~/.nodeprep/venv/bin/pip install -q{flags} "
                "--no-index --find-links ~/.nodeprep/wheelhouse "
                "-r ~/.nodeprep/wheelhouse/requirements.lock",
            ],
            lock,
        )
        ph["venv+pip"], t = time.perf_counter() - t, time.perf_counter()
        got = pystack.sh(
            [
                "ssh",
                *opts,
                dest,
                "uname -m; ~/.nodeprep/venv/bin/python -c 'import torch; print(torch.__version__)'",
            ]
        ).split()
        ph["import torch"] = time.perf_counter() - t
        if got != ["aarch64", TORCH]:
            raise RuntimeError(f"{node.name}: {got}, want aarch64 {TORCH}")
        return ph

    with ThreadPoolExecutor(len(info.nodes)) as pool:
        phases = list(pool.map(one, info.nodes))
    return time.perf_counter() - t0, {k: max(p[k] for p in phases) for k in phases[0]}


def main():
    tmp = Path(tempfile.mkdtemp(prefix="nodeprep-arm-"))
    try:
        info, settings, env = bench_lab(nodes, NAME, arch=("aarch64",))
        state = Path(settings.state_dir)
        cmd = provision_cmd(info, tmp)
        log(
            f"aarch64 bench: {nodes} emulated aarch64 nodes, {runs} rounds; "
            "warming the controller cache"
        )
        wipe(info)
        dt, ph, _ = pystack.run_provision(cmd, env)
        log(f"  warm-up provision {dt:.1f} s ({pystack.fmt(ph)})")
        house = state / "wheelhouse" / "cp311-aarch64-glibc2.36"
        names = [
            "invoke provision (cold aarch64 nodes)",
            "by hand, pip --no-compile (same work)",
            "by hand, pip default (byte-compiles)",
        ]
        times = {k: [] for k in names}
        phases = {k: [] for k in names}
        foreign = {k: [] for k in names}
        for i in range(runs):
            for k in names if i % 2 == 0 else names[::-1]:
                wipe(info)
                with Foreign() as fg:
                    if k == names[0]:
                        dt, ph, _ = pystack.run_provision(cmd, env)
                        pystack.check_cold(pystack.report(state), nodes, cached=True)
                    else:
                        dt, ph = by_hand(info, settings, house, compile_=(k == names[2]))
                times[k].append(dt)
                phases[k].append(ph)
                foreign[k].append(fg.mean)
                log(
                    f"  round {i + 1}: {k:<40} {dt:6.1f} s  "
                    f"({pystack.fmt(ph)}; foreign procs {fg.mean:.2f})"
                )
        res = summary(
            f"cold provision of {nodes} aarch64 lab nodes (qemu-user) from x86_64, {runs} "
            "interleaved rounds (controller cache warm; nodes wiped before every run)",
            times,
            names[1],
        )
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med[names[0]] / med[names[1]]
        log(
            f"  nodeprep / same work by hand: x{ratio:.2f} (target <= x{TARGET:.2f}: "
            f"{'met' if ratio <= TARGET else 'NOT met'}); "
            f"/ naive hand install: x{med[names[0]] / med[names[2]]:.2f}"
        )
        for k in names:
            log(
                f"  {k} median phases: "
                + pystack.fmt({p: statistics.median(x[p] for x in phases[k]) for p in phases[k][0]})
            )
        res.update(ratio=ratio, target=TARGET, phases=phases, foreign=foreign)
        save(f"aarch64-{nodes}", [res])
    finally:
        bench_lab_down(NAME)
        shutil.rmtree(tmp, ignore_errors=True)


main()
