"""Tiny DistributedDataParallel trainer: a 2-layer MLP on synthetic regression data.

Run under torchrun, the DeepSpeed launcher, mpirun or srun (rank env read from any of them).
Rank 0 snapshots model + optimizer + epoch/step atomically after every epoch; at start rank 0
reads the snapshot and broadcasts it, so all ranks resume identically even when the nodes do
not share a filesystem. --fail-at-step / --sleep-per-step exist for failure and kill tests.
Standalone on purpose: stdlib + torch only, nodeprep is not installed on the nodes.
"""

import argparse
import contextlib
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

BATCH, FEATURES = 16, 8


def say(line):
    # one write(2) per line: print() issues text and newline separately, so lines of
    # ranks sharing a pipe interleave ("...device=cpurank 1/2 ...")
    os.write(1, (line + "\n").encode())


def rank_env():
    """(rank, world_size, local_rank) from whichever launcher started us."""
    for names in (
        ("RANK", "WORLD_SIZE", "LOCAL_RANK"),  # torchrun, deepspeed launch.py
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ):
        if all(n in os.environ for n in names):
            return tuple(int(os.environ[n]) for n in names)
    sys.exit(
        "ddp: no rank environment (RANK/WORLD_SIZE/LOCAL_RANK, OMPI_COMM_WORLD_* or "
        "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID): start this under a launcher"
    )


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # DeepSpeed's launch.py appends --local_rank=N; the rank env already says the same.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=5)
    p.add_argument("--snapshot", default="snapshot.pt")
    p.add_argument("--fail-at-step", type=int, default=0, help="global step (1-based) to crash at")
    p.add_argument("--fail-rank", type=int, default=0)
    p.add_argument(
        "--fail-signal",
        type=int,
        default=0,
        help="at --fail-at-step, kill yourself with this signal (9: SIGKILL) instead of exit 1",
    )
    p.add_argument(
        "--hang-at-step",
        type=int,
        default=0,
        help="global step at which --fail-rank blocks forever (the others wait in a collective)",
    )
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="no gradient all-reduce per step (ranks compute alone until the epoch's end)",
    )
    p.add_argument("--sleep-per-step", type=float, default=0.0)
    p.add_argument("--log-every", type=int, default=0, help="0: first and last step of an epoch")
    return p.parse_args()


def inject_fault(args, rank, step):
    """--fail-at-step (exit 1, or --fail-signal) and --hang-at-step, for the failure tests."""
    if step == args.fail_at_step:
        say(f"rank {rank} failing on purpose at step {step}")
        if args.fail_signal:
            os.kill(os.getpid(), args.fail_signal)
        os._exit(1)  # like a crash: no cleanup, peers must notice
    if step == args.hang_at_step:
        say(f"rank {rank} hanging on purpose at step {step}")
        while True:
            time.sleep(1)


def beat():
    """Tell nodeprep this rank is making progress (its --hang-timeout watches output and this)."""
    path = os.environ.get("NODEPREP_HEARTBEAT")
    if path:
        try:
            os.utime(path)
        except FileNotFoundError:
            open(path, "a").close()
        except OSError:
            pass


def save_atomic(obj, path):
    # tmp + fsync + rename: a kill mid-write must leave the previous snapshot intact
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def init_group(rank: int, world: int, cuda: bool) -> int:
    """The process group, one key space per torchrun restart round; returns the round (1..)."""
    timeout = datetime.timedelta(seconds=float(os.environ.get("NODEPREP_PG_TIMEOUT", "60")))
    store, round_no = None, 1
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun keeps its store across restarts, and gloo would then dial the previous
        # round's addresses ("Connection refused"): each round gets its own key space. Every
        # restart starts every rank once on every node, so how often THIS rank number has
        # started is the round number everywhere. TORCHELASTIC_RESTART_COUNT is not: an agent
        # restarting for a membership change does not count it, one that saw its own rank
        # fail does (a race that left the ranks waiting on different keys).
        agent = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world,
            is_master=False,
            timeout=timeout,
        )
        round_no = agent.add(f"nodeprep/starts/rank_{rank}", 1)
        store = dist.PrefixStore(f"nodeprep/round_{round_no}", agent)
    dist.init_process_group(
        "nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=timeout, store=store
    )
    return round_no


def resume(rank: int, path: str, model, opt) -> tuple[int, int, float]:
    """(epoch, step, loss) from the snapshot rank 0 reads, model and optimizer loaded on every
    rank."""
    # only rank 0 reads: worker nodes may not have the file (no shared filesystem)
    box = [None]
    if rank == 0 and os.path.exists(path):
        box[0] = torch.load(path, map_location="cpu", weights_only=True)
    dist.broadcast_object_list(box, src=0)
    start_epoch = 0
    step = 0
    loss_value = float("nan")
    if box[0] is not None:
        model.load_state_dict(box[0]["model"])
        opt.load_state_dict(box[0]["optimizer"])
        start_epoch = box[0]["epoch"]
        step = box[0]["step"]
        loss_value = box[0]["loss"]
        again = os.environ.get("NODEPREP_RESTART", "0")  # train --restarts' relaunch
        say(
            f"rank {rank} resumed from epoch {start_epoch} step {step}"
            + (f" (relaunch {again})" if again != "0" else "")
        )
    return start_epoch, step, loss_value


def _data(args, rank: int, world: int):
    """(sampler, loader) of the synthetic regression data, the same on every rank (seeded:
    the model's initial weights, made next, come from the same seed)."""
    torch.manual_seed(0)  # same data and init everywhere; DDP broadcasts anyway
    x = torch.randn(args.steps_per_epoch * BATCH * world, FEATURES)
    y = x @ torch.linspace(-1, 1, FEATURES).unsqueeze(1) + 0.01 * torch.randn(len(x), 1)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    return sampler, loader


def _model(device):
    """(model, optimizer): a small MLP on DEVICE and its SGD."""
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt


def main():
    args = parse_args()
    rank, world, local_rank = rank_env()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    round_no = init_group(rank, world, cuda)

    sampler, loader = _data(args, rank, world)
    model, opt = _model(device)

    start_epoch, step, loss_value = resume(rank, args.snapshot, model, opt)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    loss_fn = torch.nn.MSELoss()
    # fail (--fail-at-step) only in the first round: a restarted job must be able to finish
    first_attempt = round_no == 1

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle per epoch, same on every rank
        for i, (xb, yb) in enumerate(loader):
            step += 1
            if rank == args.fail_rank and first_attempt:
                inject_fault(args, rank, step)
            beat()
            opt.zero_grad()
            with ddp.no_sync() if args.no_sync else contextlib.nullcontext():
                loss = loss_fn(ddp(xb.to(device)), yb.to(device))
                loss.backward()
            opt.step()
            last = i == len(loader) - 1
            if (args.log_every and step % args.log_every == 0) or (
                not args.log_every and (i == 0 or last)
            ):
                say(f"rank {rank} epoch {epoch} step {step} loss {loss.item():.6f}")
            if args.sleep_per_step:
                time.sleep(args.sleep_per_step)
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the reported loss is the mean over ranks
        loss_value = mean.item() / world
        if rank == 0:
            save_atomic(
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "epoch": epoch + 1,
                    "step": step,
                    "loss": loss_value,
                },
                args.snapshot,
            )
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        say(f"ddp: done epochs={args.epochs} final_loss={loss_value:.6f}")
    # skip interpreter teardown: after a torchrun restart, gloo's threads sometimes abort there
    # ("terminate called without an active exception", exit -6) though the work is done
    os._exit(0)


if __name__ == "__main__":
    main()
