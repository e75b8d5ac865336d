"""Seed 003's multinode DDP step as its user runs it after `module load cray-python/3.11.7
cuda/12.6` (the lab's module tree, lab/modules.py): it needs what the cuda module sets (CUDA_HOME
with its nvcc, NP_LAB_CUDA), a venv made by a python module's interpreter (cray-python's does not
even start without its module's LD_LIBRARY_PATH) and the seed's requirements (tqdm, yaml), so a
rank started without the modules fails here, and a pass proves they were loaded. Then a few DDP
steps (gloo) and an all_reduce whose sum every rank checks. Nothing in it knows about nodeprep."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    cuda, home = os.environ.get("NP_LAB_CUDA"), os.environ.get("CUDA_HOME", "")
    if cuda != "12.6" or not os.path.isfile(os.path.join(home, "bin", "nvcc")):
        print(f"modules-ddp: no cuda/12.6 module here (NP_LAB_CUDA={cuda!r}, CUDA_HOME={home!r})")
        return 3
    with open(os.path.join(sys.prefix, "pyvenv.cfg")) as f:
        made_by = next((ln.split("=", 1)[1].strip() for ln in f if ln.startswith("home")), "")
    if "/lab-modules/sw/" not in made_by or not os.environ.get("NP_LAB_PYTHON_MODULE"):
        print(f"modules-ddp: the venv was not made by the python module ({made_by})")
        return 4
    import tqdm  # noqa: F401  the seed's requirements, in that venv
    import yaml  # noqa: F401

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(16, 8)).sum().backward()
        opt.step()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    assert total.item() == world * (world + 1) / 2, total
    print(f"modules-ddp: rank {rank}/{world} ok under cuda {cuda}, venv from {made_by}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
