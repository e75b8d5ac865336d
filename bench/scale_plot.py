"""Draw bench/scale.png from scale_bench results: wall time and controller CPU per node
against node count, one line per contender (nodeprep's no-op provision and facts, bare
Fabric, pyinfra), from the newest result file that holds each size.

matplotlib is a bench-only tool: it lives in a venv of its own (.nodeprep/bench-venvs/plot,
made on first use from the package registry), not in the project's.
Usage: bench/scale_plot.py [RESULT.json ...] (default: every bench/results/scale-[0-9]*.json)"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLOT_VENV = ROOT / ".nodeprep" / "bench-venvs" / "plot"
OUT = ROOT / "bench" / "scale.png"


def ensure_matplotlib() -> None:
    """Re-run this script under the plot venv when matplotlib is not importable here."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        return
    py = PLOT_VENV / "bin" / "python"
    if not py.exists():
        print(f"scale_plot: creating {PLOT_VENV.relative_to(ROOT)} (matplotlib)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(PLOT_VENV)], check=True)
        subprocess.run(
            [
                str(py),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "matplotlib>=3.8,<4",
            ],
            check=True,
        )
    os.execv(str(py), [str(py), *sys.argv])


def points(files: list[Path]) -> dict[str, dict[int, tuple[float, float]]]:
    """{contender: {nodes: (wall s, controller CPU ms/node)}}, newest file wins per size.
    Contenders are named without their version numbers ("pyinfra 3.10.1 deploy" -> pyinfra)."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for f in sorted(files, key=lambda p: p.stat().st_mtime):
        for size in json.loads(f.read_text()):
            if size.get("shape", "private") != "private":
                continue
            for name, wall in size["wall"].items():
                if "(OLD)" in name:
                    continue
                label = "pyinfra deploy (same files)" if name.startswith("pyinfra") else name
                out.setdefault(label, {})[size["nodes"]] = (wall, size["cpu_ms_per_node"][name])
    return out


def draw(data: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, by_n in sorted(data.items()):
        ns = sorted(by_n)
        style = dict(marker="o", linewidth=2 if "provision" in name else 1.2)
        a.plot(ns, [by_n[n][0] for n in ns], label=name, **style)
        b.plot(ns, [by_n[n][1] for n in ns], label=name, **style)
    a.set(
        title="wall time (median of each result file's runs: 3, or 5)",
        xlabel="lab nodes",
        ylabel="seconds",
    )
    b.set(title="controller CPU per node", xlabel="lab nodes", ylabel="ms per node")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({n for by_n in data.values() for n in by_n}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.suptitle(
        "nodeprep scale bench (bench/scale_bench.py): no-op provision of 5 roles, "
        "2-core controller, lab nodes on the same machine",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ensure_matplotlib()
    files = [Path(a) for a in sys.argv[1:]] or sorted(
        (ROOT / "bench" / "results").glob("scale-[0-9]*.json")
    )
    data = points(files)
    if not data:
        raise SystemExit("scale_plot: no scale results (run bench/scale_bench.py first)")
    draw(data, OUT)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
