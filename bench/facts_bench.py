"""`invoke facts` on N lab nodes against a bare Fabric ThreadingGroup running `true` on the
same nodes (issue 2: target at most 1.5x at 8 nodes). Usage: bench/facts_bench.py [NODES] [RUNS]"""

import sys

from lib import VENV, bench_lab, bench_lab_down, rounds, save, summary

nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 8
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
info, settings, env = bench_lab(nodes)
inv = str(info.inventory)
try:
    times = rounds(
        {
            "invoke facts": [str(VENV / "invoke"), "facts", "--inventory", inv],
            "bare Fabric ThreadingGroup true": [str(VENV / "python"), "bench/bare_fabric.py", inv],
        },
        runs,
        env,
    )
finally:
    bench_lab_down()
res = summary(
    f"facts on {nodes} lab nodes, {runs} interleaved runs (whole processes)",
    times,
    "bare Fabric ThreadingGroup true",
)
save(f"facts-{nodes}", [res])
