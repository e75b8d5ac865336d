"""A user's DDP script in the shape of pytorch/examples' DDP tutorial
(distributed/ddp-tutorial-series/multinode.py): `snapshot_ddp.py TOTAL_EPOCHS SAVE_EVERY`,
run by any launcher that sets the env:// rendezvous and LOCAL_RANK; every SAVE_EVERY epochs
its state goes to snapshot.pt beside the script, and a start that finds snapshot.pt resumes
from it. Written for this repository (the tutorial needs CUDA and NCCL; this runs on CPU with
gloo), nothing copied. It knows nothing of nodeprep: it prints NODEPREP_RESTART only so the
tests can see which attempt a line is from. --raise-at-epoch: a bug of the script's own."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SNAPSHOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "snapshot.pt")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("total_epochs", type=int)
    p.add_argument("save_every", type=int)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--sleep", type=float, default=0.05, help="seconds per batch")
    p.add_argument("--raise-at-epoch", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.rand(512, 20), torch.rand(512, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = torch.nn.Linear(20, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    first = 0
    if os.path.exists(SNAPSHOT):
        snap = torch.load(SNAPSHOT, map_location="cpu")
        model.load_state_dict(snap["model"])
        first = snap["epochs_run"]
        print(f"[rank {rank}] resuming from snapshot.pt at epoch {first}", flush=True)
    else:
        print(f"[rank {rank}] no snapshot.pt: starting at epoch 0", flush=True)
    restart = os.environ.get("NODEPREP_RESTART", "0")
    ddp = DDP(model)
    for epoch in range(first, args.total_epochs):
        sampler.set_epoch(epoch)
        if epoch == args.raise_at_epoch:
            raise RuntimeError(f"bad batch at epoch {epoch}")
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            time.sleep(args.sleep)
        print(f"[rank {rank}] local {local} epoch {epoch} done (restart {restart})", flush=True)
        if rank == 0 and (epoch + 1) % args.save_every == 0:  # one writer, whole or not at all
            torch.save({"model": model.state_dict(), "epochs_run": epoch + 1}, SNAPSHOT + ".tmp")
            os.replace(SNAPSHOT + ".tmp", SNAPSHOT)
    dist.barrier()
    if rank == 0:
        print(f"snapshot_ddp: done {args.total_epochs} epochs", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
