"""Distributed health check: run under torchrun, the DeepSpeed launcher, mpirun or srun.

Every rank prints one line describing itself; rank 0 ends with `health: OK world_size=W`.
Exit 1 with a `health: FAIL ...` line when init times out, the all_reduce sum is wrong,
or the ranks disagree on torch/CUDA/NCCL versions (NCCL versions must match across nodes).
On nccl a rank's line also tells the libnccl it really runs (path and version, from its
/proc/self/maps: torch.cuda.nccl.version() is the NCCL torch was built with) and the NCCL
net plugin mapped after NCCL's init (nccl_net=none: NCCL's internal IB/Socket); the ranks
must agree on that libnccl's version too. None of these on gloo.
Stdlib + torch only (nodeprep is not installed on the nodes), and nccl_probe.py, which `train`
ships beside it.
"""

import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist


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
        "health: FAIL no rank environment (RANK/WORLD_SIZE/LOCAL_RANK, OMPI_COMM_WORLD_*"
        " or SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID): start this under a launcher"
    )


def _nccl_probe():
    """nccl_probe.py: shipped beside this script into the job directory; in nodeprep's source
    tree it is one directory up (nodeprep/nodeside/)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (here, os.path.dirname(here)):
        if os.path.isfile(os.path.join(d, "nccl_probe.py")) and d not in sys.path:
            sys.path.append(d)
    import nccl_probe

    return nccl_probe


def nccl_runtime():
    """(words for the rank's line, the libnccl's version): what this process maps now."""
    try:
        probe = _nccl_probe()
        with open("/proc/self/maps") as f:
            found = probe.mapped(f.read())
        version = None
        if found["nccl"]:
            version = probe.lib_version(found["nccl"][0])
            where = ", ".join(found["nccl"])
        else:
            where = (
                "static (in %s)" % found["torch_cuda"].rpartition("/")[2]
                if found["torch_cuda"]
                else "none mapped"
            )
        net = ", ".join(found["net"]) or "none"
        return f"nccl_lib={where}" + (
            f" ({version})" if version else ""
        ) + f" nccl_net={net} ", version
    except Exception as exc:  # a finding on the line, never a failed rank
        return f"nccl_lib=? ({type(exc).__name__}: {exc}) ", None


def fail(rank, message):
    say(f"health: FAIL rank {rank}: {message}")
    sys.exit(1)


def pick_device(rank: int, local_rank: int):
    """(cuda?, device, description) for this rank; fails the rank on a GPU it cannot have."""
    cuda = torch.cuda.is_available()
    if cuda:
        count = torch.cuda.device_count()
        if local_rank >= count:  # two ranks on one GPU would make NCCL fail obscurely
            fail(
                rank,
                f"local_rank {local_rank} but only {count} visible GPU(s) "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')})",
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        cap = torch.cuda.get_device_capability(local_rank)
        desc = (
            f"cuda:{local_rank} capability {cap[0]}.{cap[1]} "
            f"{torch.cuda.get_device_name(local_rank)}"
        )
    else:
        device = torch.device("cpu")
        desc = "cpu"
    return cuda, device, desc


def _problems(got: list, world: int, every: list) -> list[str]:
    """What the collectives showed wrong: the all_reduce of ones (GOT) not WORLD everywhere,
    the group's size, ranks that differ in torch, CUDA or NCCL (EVERY rank's versions)."""
    problems = []
    if any(value != world for value in got):
        problems.append(f"all_reduce of ones gave {got}, expected {float(world)}")
    if dist.get_world_size() != world:
        problems.append(f"process group size {dist.get_world_size()} != WORLD_SIZE {world}")
    if len(set(every)) > 1:
        problems.append(
            "ranks differ in (torch, cuda, nccl built, libnccl run): "
            + ", ".join(f"rank {r}={v}" for r, v in enumerate(every))
        )
    return problems


def main():
    rank, world, local_rank = rank_env()
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:  # mpirun/srun do not set them: the caller must
            fail(rank, f"{name} is not set (pass it through the launcher's environment)")
    cuda, device, desc = pick_device(rank, local_rank)
    backend = "nccl" if cuda else "gloo"
    timeout = float(os.environ.get("NODEPREP_PG_TIMEOUT", "60"))
    try:  # env:// reads MASTER_ADDR/PORT; rank/size given explicitly
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
        )
    except Exception as exc:  # a peer that never came up: say so instead of a traceback
        fail(
            rank,
            f"init_process_group({backend}) via {os.environ['MASTER_ADDR']}:"
            f"{os.environ['MASTER_PORT']} failed within {timeout:g}s: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
        )
    try:
        nccl = "-"
        if cuda:
            try:
                v = torch.cuda.nccl.version()
                nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception:
                nccl = "?"
        ones = torch.ones(4, device=device)
        dist.all_reduce(ones)
        got = ones.tolist()
        # after NCCL's init (the all_reduce): its net plugin is mapped by now
        runtime, lib = nccl_runtime() if cuda else ("", None)
        versions = (torch.__version__, torch.version.cuda, nccl, lib)
        every = [None] * world
        dist.all_gather_object(every, versions)
        dist.barrier()
    except Exception as exc:
        fail(rank, f"collective failed: {type(exc).__name__}: {exc}")
    say(
        f"rank {rank}/{world} host={socket.gethostname()} local_rank={local_rank} "
        f"backend={backend} torch={versions[0]} cuda={versions[1]} nccl={nccl} "
        f"{runtime}device={desc}"
    )
    problems = _problems(got, world, every)
    dist.barrier()  # rank lines first, verdict last
    dist.destroy_process_group()
    if problems:  # every rank sees the same data, so all exit 1 together
        if rank == 0:
            say("health: FAIL " + "; ".join(problems))
        sys.exit(1)
    if rank == 0:
        say(f"health: OK world_size={world}")


if __name__ == "__main__":
    main()
