"""A plain user torch script, as its author would write it for torchrun: argparse of its own,
`dist.init_process_group()` with the env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT from the environment), a few steps of a tiny model under DDP, a barrier. Nothing
in it knows about nodeprep, MPI or Slurm; no --local_rank argument."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--fail-at-step", type=int, default=-1)
    p.add_argument("--fail-rank", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        if step == args.fail_at_step and rank == args.fail_rank:
            print(f"plain: rank {rank} fails at step {step}", flush=True)
            sys.exit(1)
        x = torch.randn(4, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.sleep)
    dist.barrier()
    print(
        f"plain: done rank {rank}/{world} local {local}/{os.environ.get('LOCAL_WORLD_SIZE')} "
        f"steps {args.steps}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
