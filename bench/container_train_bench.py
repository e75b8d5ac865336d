"""`invoke train` in the job's containers against the same train on the hosts' venvs (issue 45:
at most +2 s), on N lab nodes that hold both: the venv (`invoke provision`, the venv way) and the
lab's training image (lab/images.train_root: the same torch 2.13.0+cpu and DeepSpeed, loaded by
the container role). Contenders, whole processes, medians of RUNS interleaved rounds (one warm-up
each, order reversed every other round), every run must print `health: OK world_size=N`:
  venv       invoke train --launcher L --payload health --no-container
  container  invoke train --launcher L --payload health   (the inventory names the image)
for L in deepspeed and torchrun. The container's extra: start and remove one container a node,
the exec into it, the image's Python starting from its overlay.
Usage: bench/container_train_bench.py [NODES=2] [RUNS=5]"""

import os
import statistics
import sys
import time
from pathlib import Path

import yaml

from lib import ROOT, VENV, bench_lab, bench_lab_down, save, summary, timed
from nodeprep.lab import images
from nodeprep.ops.pystack.wheelhouse import Platform, Wheelhouse

TARGET = 2.0  # seconds over the venv way
args = [a for a in sys.argv[1:] if not a.startswith("--")]
nodes = int(args[0]) if args else 2
runs = int(args[1]) if len(args) > 1 else 5
LAB, SUBNET = "ctb", 172


def log(msg=""):
    print(msg, flush=True)


def wheels() -> Path:
    house = Wheelhouse(images.CACHE / "wheelhouse")
    built = house.build(images.TRAIN_BUILDS, images.TRAIN_PINS[0], [])
    platform = Platform("x86_64", "3.11", "2.36")
    house.resolve(platform, list(images.TRAIN_PINS), [], [built])
    return house.root / platform.key


def check_ok(out):
    if f"health: OK world_size={nodes}" not in out:
        raise SystemExit(f"bench: run did not print health: OK:\n{out[-2500:]}")


def main():
    log(f"container train bench: {nodes} nodes, {runs} rounds, {os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    image = images.docker_archive(
        images.train_root(wheels(), log=log),
        ROOT / ".nodeprep" / "bench-images" / "np-train.tar",
        "localhost/np-train:1",
        env=images.TRAIN_PATH,
    )
    log(
        f"  setup: the training image {image.stat().st_size / 1e6:.0f} MB in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    info, settings, env = bench_lab(nodes, name=LAB, subnet=SUBNET, containers=True)
    try:
        inv = Path(info.inventory)
        data = yaml.safe_load(inv.read_text())
        data["vars"]["container_image"] = str(image)
        inv.write_text(yaml.safe_dump(data, sort_keys=False))
        tmp = ROOT / ".nodeprep" / f"bench-{LAB}" / "controller"
        tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
        prov = [str(VENV / "invoke"), "provision", "--inventory", str(inv)]
        prov += ["--set", f"controller_key={tmp / 'id_ed25519'}"]
        prov += ["--set", f"controller_ssh_config={tmp / 'config'}"]
        log(f"  setup: `invoke provision` (venv and image) {timed(prov, env):.1f} s")
        results = []
        for launcher in ("deepspeed", "torchrun"):
            base = [str(VENV / "invoke"), "train", "--inventory", str(inv)]
            base += ["--launcher", launcher, "--payload", "health"]
            names = {"venv": base + ["--no-container"], "container": base}
            for cmd in names.values():  # warm-up
                timed(cmd, env, verify=check_ok)
            times = {k: [] for k in names}
            for i in range(runs):
                for k in list(names) if i % 2 == 0 else list(names)[::-1]:
                    times[k].append(timed(names[k], env, verify=check_ok))
                log(
                    f"  {launcher} round {i + 1}: "
                    + ", ".join(f"{k} {v[-1]:.2f}" for k, v in times.items())
                )
            res = summary(f"{launcher} health on {nodes} lab nodes, {runs} rounds", times, "venv")
            extra = res["medians"]["container"] - res["medians"]["venv"]
            paired = statistics.median(a - b for a, b in zip(times["container"], times["venv"]))
            log(
                f"  {launcher}: container - venv {extra:+.2f} s (median of per-round "
                f"differences {paired:+.2f} s); target <= +{TARGET} s: "
                f"{'met' if extra <= TARGET else 'NOT met'}"
            )
            res.update(extra=extra, paired_extra=paired, target=TARGET, met=extra <= TARGET)
            results.append(res)
        log(f"\nresults: {save('container-train', results)}")
    finally:
        bench_lab_down(LAB)


if __name__ == "__main__":
    main()
