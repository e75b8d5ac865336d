"""How fast a failure stops a job: the time from the failure to the last rank gone, for each
launcher and each failure, medians of RUNS runs on a 2-node lab (the integration matrix of
tests/integration/test_train_watch.py, timed). The clock is the nodes' own (the rank wrapper
records each rank's end; one machine here, so no skew):
  exit     a rank exits 1 at step 3, no collective after it (ddp --no-sync)
  sigkill  a rank is killed with SIGKILL at step 3
  node     worker-1 stops (lab stop_node: sshd and every process in it killed); measured from
           the last heartbeat of its watcher
  silent   worker-1 goes silent (lab silence_node: blackhole routes, no RST, its processes go on,
           as a network partition looks); measured from the watcher's last heartbeat to the
           last rank gone on the nodes that answer, and also from the silence to the end of
           `invoke train` (the controller's clock); the job's leftovers on worker-1 are
           stopped after each run with train.stop once it answers again
  hang     a rank blocks forever at step 4, --hang-timeout 10; measured from the last output
           or heartbeat of any rank
Targets (issue 15): at most 10 s for exits and node loss, hang-timeout + 10 s for hangs.
Also the whole `invoke train` wall time per case. Usage: bench/stop_bench.py [RUNS=3] [CASES]"""

import json
import statistics
import sys
import threading
import time
import uuid

from lib import bench_lab, bench_lab_down, save
from nodeprep import cli
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions, RunsOptions, TrainOptions
from nodeprep.ops.train import rundir

LAUNCHER_PAIRS = {
    "deepspeed-pdsh": ("deepspeed", "pdsh"),
    "deepspeed-openmpi": ("deepspeed", "openmpi"),
    "torchrun": ("torchrun", "pdsh"),
    "mpirun": ("mpirun", "pdsh"),
}
LONG = ["--epochs", "100", "--steps-per-epoch", "40", "--sleep-per-step", "0.1"]
CASES = {
    "exit": ["--no-sync", "--fail-at-step", "3", "--fail-rank", "1"],
    "sigkill": ["--fail-at-step", "3", "--fail-rank", "1", "--fail-signal", "9"],
    "hang": ["--hang-at-step", "4", "--fail-rank", "1"],
    "node": [],
    "silent": [],
}
args = [a for a in sys.argv[1:]]
runs = int(args[0]) if args else 3
cases = args[1].split(",") if len(args) > 1 else list(CASES)


def one(info, settings, launcher, ds, case) -> tuple[float, float, str, float | None]:
    """(failure -> last rank gone, train wall, root cause, loss -> train returned or None)."""
    opts = TrainOptions(
        inventory=str(info.inventory),
        limit="worker-[0-1]",
        launcher=launcher,
        payload="ddp",
        args=tuple(LONG + CASES[case] + ["--snapshot", f"b-{uuid.uuid4().hex[:8]}.pt"]),
        timeout=240,
        ds_launcher=ds,
        hang_timeout=10 if case == "hang" else None,
    )
    t0 = time.monotonic()
    lost: list[float] = []
    if case in ("node", "silent"):
        lose = labmod.stop_node if case == "node" else labmod.silence_node
        killer = threading.Thread(
            target=lose_worker_1,
            args=(info, settings, set(rundir.runs_of(settings.runs)), lose, lost),
        )
        killer.start()
    code = cli.train(opts, settings)
    ended = time.monotonic()
    wall = ended - t0
    if case == "node":
        killer.join()
        labmod.up(
            len(info.nodes),
            name=info.name,
            settings=settings,
            options=labmod.UpOptions(inventory_dir=info.inventory.parent),
            log=lambda *a: None,
        )
    if case == "silent":
        killer.join()
        labmod.silence_node(info, 1, silent=False)
        run = rundir.runs_of(settings.runs)[-1]
        cli.train_stop(
            RunsOptions(run=run.name[len(rundir.PREFIX) :]), settings
        )  # what it left on worker-1
    state = json.loads((rundir.runs_of(settings.runs)[-1] / "state.json").read_text())
    out = state.get("outcome") or {}
    if code != 1 or out.get("stop_seconds") is None:
        raise SystemExit(f"{launcher}/{ds} {case}: exit {code}, {out.get('failure')}")
    return out["stop_seconds"], wall, out["failure"], (ended - lost[0]) if lost else None


def lose_worker_1(info, settings, before, lose, lost: list):
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # this run's rank 1 has written a line
        runs_ = [r for r in rundir.runs_of(settings.runs) if r not in before]
        if runs_ and (runs_[-1] / "nodes" / "worker-1" / "r1.out").exists():
            break
        time.sleep(0.3)
    time.sleep(2)
    lose(info, 1)
    lost.append(time.monotonic())


def main():
    info, settings, _env = bench_lab(2, "stop")
    try:
        assert cli.provision(ProvisionOptions(inventory=str(info.inventory)), settings) == 0
        results = []
        for case in cases:
            for name, (launcher, ds) in LAUNCHER_PAIRS.items():
                got = [one(info, settings, launcher, ds, case) for _ in range(runs)]
                stop = [g[0] for g in got]
                wall = [g[1] for g in got]
                loss = [g[3] for g in got if g[3] is not None]
                r = {
                    "launcher": name,
                    "case": case,
                    "stop_median": statistics.median(stop),
                    "stop_runs": stop,
                    "wall_median": statistics.median(wall),
                    "root_cause": got[0][2],
                    "loss_to_end_median": statistics.median(loss) if loss else None,
                    "loss_to_end_runs": loss,
                }
                results.append(r)
                print(
                    f"{case:<8} {name:<18} failure -> last rank gone: "
                    f"median {r['stop_median']:5.1f} s "
                    f"(runs {' '.join(f'{x:.1f}' for x in stop)}); "
                    f"train wall {r['wall_median']:5.1f} s"
                    + (
                        f"; loss -> train returned median {r['loss_to_end_median']:.1f} s"
                        if loss
                        else ""
                    )
                    + f"; {got[0][2][:70]}",
                    flush=True,
                )
        save("stop", results)
    finally:
        bench_lab_down("stop")


if __name__ == "__main__":
    main()
