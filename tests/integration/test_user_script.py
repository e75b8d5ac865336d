"""One plain user script (tests/integration/scripts/plain_ddp.py: argparse of its own, env://
init, DDP, a barrier; nothing about nodeprep, MPI or Slurm, no --local_rank) under every
launcher on 2 lab nodes, unchanged: deepspeed (pdsh and openmpi), torchrun, mpirun and srun
(the lab's real Slurm). The rank wrapper's contract gives it RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE from the launcher's own variables and keeps DeepSpeed's --local_rank from a
script that does not declare it. Then the same script's rank 1 exits 1 at step 3: every rank on
every node stops within 10 s of it, and the output names that rank first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep.commands.options import TrainOptions

NODES = "worker-[0-1]"
SCRIPT = Path(__file__).resolve().parent / "scripts" / "plain_ddp.py"
LAUNCHER_PAIRS = [
    ("deepspeed", "pdsh"),
    ("deepspeed", "openmpi"),
    ("torchrun", "pdsh"),
    ("mpirun", "pdsh"),
    ("srun", "pdsh"),
]
IDS = ["deepspeed-pdsh", "deepspeed-openmpi", "torchrun", "mpirun", "srun"]


def _train(lab, settings, capfd, launcher, ds, args, timeout=180) -> tuple[int, str]:
    code = api.train(
        TrainOptions(
            inventory=str(lab.inventory),
            limit=NODES,
            launcher=launcher,
            payload=str(SCRIPT),
            args=tuple(args),
            timeout=timeout,
            ds_launcher=ds,
        ),
        settings,
    )
    out = capfd.readouterr()
    return code, out.out + out.err


def _gloo_teardown_race(code: int, out: str) -> bool:
    """torch's gloo can abort a rank that already passed the script's last barrier while its
    peer is still leaving it (pytorch/gloo#155, "Barrier followed by context destruction causes
    some participants to fail"): seen once in ~50 CI runs of this test, under mpirun, as
    "terminate called without an active exception" right after "plain: done". nodeprep counts
    such a crash as done when it comes after the script's exit handlers (rank.py) and names it
    otherwise; only that failure, after both ranks said done, earns one more try."""
    failed = re.search(r"FAILED: (\S+ r(\d)) was killed by SIGABRT", out)
    return bool(
        code
        and failed
        and "terminate called without an active exception" in out
        and f"plain: done rank {failed.group(2)}/2" in out
    )


@pytest.mark.parametrize("launcher,ds", LAUNCHER_PAIRS, ids=IDS)
def test_the_plain_script_trains_under_every_launcher(
    real_slurm, lab, lab_settings, capfd, launcher, ds
):
    code, out = _train(lab, lab_settings, capfd, launcher, ds, ["--steps", "5"])
    if _gloo_teardown_race(code, out):
        print(out)  # the first try stays in the test's output
        code, out = _train(lab, lab_settings, capfd, launcher, ds, ["--steps", "5"])
    assert code == 0, out
    done = sorted(re.findall(r"plain: done rank (\d)/(\d) local (\d)/(\d) steps 5", out))
    assert done == [("0", "2", "0", "1"), ("1", "2", "0", "1")], out


@pytest.mark.parametrize("launcher,ds", LAUNCHER_PAIRS, ids=IDS)
def test_a_failing_rank_of_the_plain_script_stops_every_rank(
    real_slurm, lab, lab_settings, lab_ssh, capfd, launcher, ds
):
    code, out = _train(
        lab,
        lab_settings,
        capfd,
        launcher,
        ds,
        ["--steps", "400", "--sleep", "0.1", "--fail-at-step", "3", "--fail-rank", "1"],
        timeout=240,
    )
    assert code != 0, out
    assert "plain: rank 1 fails at step 3" in out, out
    m = re.search(r"FAILED: (\S+) r(\d+) exited with status 1", out)
    assert m and m.group(2) == "1", out  # the root cause, first
    assert "plain: done" not in out and "0 processes left on 2 node(s)" in out, out
    # every rank stopped within 10 s of the failure (the nodes' clocks, as the watch reports it)
    gone = re.search(r"every rank gone ([\d.]+)s after the first failure", out)
    assert gone and float(gone.group(1)) <= 10, out
    left = []
    for node in lab.nodes[:2]:
        r = lab_ssh(
            node,
            "ps -u nodeprep -o stat=,args= | awk '$1 !~ /^Z/' | "
            "grep plain_ddp | grep -v grep || true",
        )
        left += r.stdout.split("\n") if r.stdout.strip() else []
    assert left == [], left
