"""all_reduce bandwidth across every rank, in the manner of nccl-tests' all_reduce_perf: for
each message size, a few warm-up calls, then timed calls; rank 0 prints one line per size with
the time per call, algorithm bandwidth (bytes / time) and bus bandwidth (algbw * 2(n-1)/n,
what each link carries in a ring, comparable across world sizes), then `allreduce: OK`.
Every result is also checked (a sum of rank-dependent values). gloo on CPU, nccl on GPU.
Run under torchrun, the DeepSpeed launcher, mpirun or srun. Standalone: stdlib + torch only.
"""

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def say(line):
    os.write(1, (line + "\n").encode())


def rank_env():
    for names in (
        ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ):
        if all(n in os.environ for n in names):
            return tuple(int(os.environ[n]) for n in names)
    sys.exit("allreduce: FAIL no rank environment: start this under a launcher")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--min-bytes", type=int, default=1 << 10)
    p.add_argument("--max-bytes", type=int, default=0, help="default 64 MiB on GPU, 4 MiB on CPU")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    return p.parse_args()


def _sizes(args, cuda: bool) -> list[int]:
    """The message sizes in bytes: --min-bytes (at least 4) up to --max-bytes (64 MiB on GPU,
    4 MiB on CPU), each --factor (at least 2) times the last."""
    top = args.max_bytes or ((64 << 20) if cuda else (4 << 20))
    sizes, n = [], max(4, args.min_bytes)
    while n <= top:
        sizes.append(n)
        n *= max(2, args.factor)
    return sizes


def _measure(buf, rank: int, args, cuda: bool) -> float:
    """Seconds per all_reduce of BUF (filled with RANK + 1 before each), the mean of
    --iters after --warmup."""
    for i in range(args.warmup + args.iters):
        if i == args.warmup:
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        buf.fill_(rank + 1)
        dist.all_reduce(buf)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / args.iters


def main():
    args = parse_args()
    rank, world, local_rank = rank_env()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=float(os.environ.get("NODEPREP_PG_TIMEOUT", "60")))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    sizes = _sizes(args, cuda)
    rows = []
    for size in sizes:
        count = size // 4  # float32
        buf = torch.empty(count, dtype=torch.float32, device=device)
        want = world * (world + 1) / 2  # sum of (rank + 1)
        dt = _measure(buf, rank, args, cuda)
        ok = bool(torch.all(buf == want).item())
        algbw = size / dt / 1e9
        sig = lambda x: float(f"{x:.4g}")  # 4 significant digits: 1 KiB on gloo is ~1e-4 GB/s
        rows.append(
            {
                "bytes": size,
                "time_us": round(dt * 1e6, 1),
                "algbw_gbps": sig(algbw),
                "busbw_gbps": sig(algbw * 2 * (world - 1) / world),
                "correct": ok,
            }
        )
        if rank == 0:
            r = rows[-1]
            say(
                f"allreduce: {size:>10} B  {r['time_us']:>10.1f} us  "
                f"algbw {r['algbw_gbps']:>9.4g} GB/s"
                f"  busbw {r['busbw_gbps']:>9.4g} GB/s  {'ok' if ok else 'WRONG RESULT'}"
            )
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        good = all(r["correct"] for r in rows)
        say(
            "allreduce-json: "
            + json.dumps({"world_size": world, "backend": backend, "ok": good, "sizes": rows})
        )
        say(f"allreduce: {'OK' if good else 'FAIL'} world_size={world} backend={backend}")
        if not good:
            os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    main()
