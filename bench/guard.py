"""The drift guard (issue 44): quick runs of the scale and train benches, each figure a ratio to
a floor measured in the same run, compared with the figures kept in bench/figures.json.

  scale_bench.py 32 3 --quick   no-op provision (five roles) and `invoke facts` on 32 nodes
                                against bare Fabric running `true` and running the facts probe
  train_bench.py 2 3 --quick    `invoke train` (health gate on) against the bare deepspeed
                                command on 2 nodes

It prints every figure beside its kept value and says plainly which moved beyond its tolerance
and by how much ("MOVED (worse)", "moved (better)"). Exit status 1 when a figure got worse.
Ratios, not seconds: this machine's speed changes from day to day (bare Fabric `true` on 32 nodes
took 0.52 s on 2026-11-24 and 1.47 s on 2026-11-28), a ratio to a floor measured in the same
rounds does not.

Usage: bench/guard.py [--record] [--only scale|train]
  --record   write this run's figures into bench/figures.json (with the date and commit), after
             a change that moved them on purpose; say so in the closing note."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "bench" / "figures.json"
PY = ROOT / ".venv" / "bin" / "python"

# the two quick bench runs; the figures each gives are named by the functions below
SCALE = "scale_bench.py 32 3 --quick"
TRAIN = "train_bench.py 2 3 --quick"


def scale_figures(result: list[dict]) -> dict[str, float]:
    r = result[0]
    wall, cpu = r["wall"], r["cpu_ms_per_node"]
    return {
        "scale32: no-op provision / bare Fabric probe (wall)": wall["no-op provision"]
        / wall["bare Fabric probe"],
        "scale32: invoke facts / bare Fabric probe (wall)": wall["invoke facts"]
        / wall["bare Fabric probe"],
        "scale32: no-op provision / bare Fabric true (wall)": wall["no-op provision"]
        / wall["bare Fabric true"],
        "scale32: no-op provision / bare Fabric true (controller CPU)": cpu["no-op provision"]
        / cpu["bare Fabric true"],
    }


def train_figures(result: list[dict]) -> dict[str, float]:
    med = result[0]["medians"]
    bare = med["bare ssh deepspeed -H hostfile"]
    return {"train2: invoke train / bare deepspeed (wall)": med["invoke train"] / bare}


BENCHES = {"scale": (SCALE, scale_figures), "train": (TRAIN, train_figures)}


def run_bench(line: str) -> tuple[list[dict], float]:
    script, *args = line.split()
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        t0 = time.perf_counter()
        r = subprocess.run(
            [str(PY), str(ROOT / "bench" / script), *args],
            cwd=ROOT,
            env=dict(os.environ, BENCH_OUT=out.name),
            capture_output=True,
            text=True,
        )
        took = time.perf_counter() - t0
        if r.returncode:
            sys.exit(f"guard: {line} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
        return json.loads(Path(out.name).read_text()), took


def compare(kept: dict, got: dict[str, float]) -> list[str]:
    """One line per figure; those beyond tolerance start with MOVED/moved."""
    lines = []
    for name, value in got.items():
        k = kept.get(name)
        if k is None:
            lines.append(f"new       {name}: {value:.2f}x (no kept figure: run with --record)")
            continue
        change = value / k["value"] - 1
        tol = k["tolerance"]
        what = f"{name}: {k['value']:.2f}x ({k['measured']}) -> {value:.2f}x ({change:+.0%}"
        if change > tol:
            lines.append(f"MOVED (worse) {what}, tolerance {tol:.0%})")
        elif change < -tol:
            lines.append(f"moved (better) {what}, tolerance {tol:.0%}: --record to keep it)")
        else:
            lines.append(f"held      {what}, within {tol:.0%})")
    return lines


def head_commit() -> str:
    """The checkout's HEAD commit (short), read from .git as git stores it."""
    git = ROOT / ".git"
    if git.is_file():  # a worktree: "gitdir: <its dir>", whose refs live in the common dir
        git = Path(git.read_text().split(":", 1)[1].strip())
    head = (git / "HEAD").read_text().strip()
    if (git / "commondir").exists():
        git = (git / (git / "commondir").read_text().strip()).resolve()
    if not head.startswith("ref: "):
        return head[:7]
    ref = head[5:]
    if (git / ref).exists():
        return (git / ref).read_text().strip()[:7]
    packed = git / "packed-refs"
    for line in packed.read_text().splitlines() if packed.exists() else []:
        if line.endswith(" " + ref):
            return line[:7]
    return "unknown"


def main() -> int:
    only = None
    if "--only" in sys.argv:
        i = sys.argv.index("--only") + 1
        only = sys.argv[i] if i < len(sys.argv) else ""
        if only not in BENCHES:
            print(
                "guard: --only takes scale or train (bench/guard.py --only train)", file=sys.stderr
            )
            return 2
    kept = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    got: dict[str, float] = {}
    t0 = time.perf_counter()
    for name, (line, figures) in BENCHES.items():
        if only and name != only:
            continue
        result, took = run_bench(line)
        got.update(figures(result))
        print(f"guard: {line}: {took:.0f} s", flush=True)
    lines = compare(kept, got)
    print(
        f"guard: {len(got)} figures in {time.perf_counter() - t0:.0f} s, "
        f"{time.strftime('%Y-%m-%d %H:%M')}, 1-min load {os.getloadavg()[0]:.2f}"
    )
    for line in lines:
        print("  " + line)
    if "--record" in sys.argv:
        commit = head_commit()
        for name, value in got.items():
            tol = kept.get(name, {}).get("tolerance", 0.12)
            kept[name] = {
                "value": round(value, 3),
                "tolerance": tol,
                "measured": time.strftime("%Y-%m-%d"),
                "commit": commit,
            }
        FIGURES.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
        print(f"guard: recorded {len(got)} figures in {FIGURES.relative_to(ROOT)}")
    return 1 if any(line.startswith("MOVED") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
