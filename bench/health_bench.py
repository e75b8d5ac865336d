"""`invoke health` (the passive tier, every check) on N lab nodes against `invoke facts` on
the same nodes (issue 29: at most 1.5x at 64 nodes), whole processes, interleaved runs; once
with plain nodes and once GPU-shaped (lab.up --gpu-record: the stand-in nvidia-smi answers
from a real recording, so the GPU checks run; a real nvidia-smi takes longer than the
stand-in). Every run must exit 0 (lab nodes have no time-sync daemon: WARN only).
Usage: bench/health_bench.py [NODES=64] [RUNS=5]"""

import sys

from lib import ROOT, VENV, bench_lab, bench_lab_down, rounds, save, summary

nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 64
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
record = ROOT / "tests" / "recordings" / "gpu" / "telegraf-dual-rtx-a5000"
results = []
try:
    for shape, records in (("plain", ("none",)), ("GPU-shaped", (str(record),))):
        info, settings, env = bench_lab(nodes, gpu_records=records)
        inv = str(info.inventory)
        # the recording's own llama-server holds its GPUs (GPU_BUSY): not this bench's concern
        times = rounds(
            {
                "invoke health": [
                    str(VENV / "invoke"),
                    "health",
                    "--inventory",
                    inv,
                    "--ignore",
                    "GPU_BUSY",
                ],
                "invoke facts": [str(VENV / "invoke"), "facts", "--inventory", inv],
            },
            runs,
            env,
        )
        results.append(
            summary(
                f"health on {nodes} {shape} lab nodes, {runs} interleaved runs",
                times,
                "invoke facts",
            )
        )
finally:
    bench_lab_down()
save(f"health-{nodes}", results)
