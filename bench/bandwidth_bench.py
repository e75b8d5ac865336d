"""`invoke bandwidth --quick` on N lab nodes (issue 29: under 30 s at 32 nodes), whole
processes, median of RUNS; also the full ring (N-1 rounds) on 8 of them for scale; each with
iperf3 (what `--tool auto` picks on the lab) and with the builtin sender. Each flow sends for
--seconds 1. The exit status is recorded, not required: on the lab's 2 shared cores
every flow is CPU-bound, so a node may be flagged by noise (the count is printed).
Usage: bench/bandwidth_bench.py [NODES=32] [RUNS=3]"""

import statistics
import sys

from lib import VENV, bench_lab, bench_lab_down, save, timed

nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 32
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
info, settings, env = bench_lab(nodes)
inv = str(info.inventory)
results = []
try:
    cases = [
        (f"{shape}, {tool}", [*extra, "--tool", tool])
        for tool in ("iperf3", "builtin")
        for shape, extra in (
            (f"quick, {nodes} nodes", ["--quick"]),
            ("full, 8 nodes", ["--limit", "worker-[0-7]"]),
        )
    ]
    for name, extra in cases:
        cmd = [str(VENV / "invoke"), "bandwidth", "--inventory", inv, "--seconds", "1", *extra]
        flagged = []

        def count(out):
            flagged.append(out.count("SLOW "))

        times = [timed(cmd, env, check=False, verify=count) for _ in range(runs)]
        med = statistics.median(times)
        print(
            f"bandwidth {name}: median {med:.2f} s (runs {' '.join(f'{t:.2f}' for t in times)}); "
            f"nodes flagged per run: {flagged}",
            flush=True,
        )
        results.append({"case": name, "median": med, "runs": times, "flagged": flagged})
finally:
    bench_lab_down()
save(f"bandwidth-{nodes}", results)
